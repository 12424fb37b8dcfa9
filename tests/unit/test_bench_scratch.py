"""A bench run's work folder (serve config, Ray logs, a 3 GB random target) goes at exit."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

MAKE = (
    "from pflash_lab.bench.launch import scratch_dir\n"
    "work = scratch_dir('pflash-test-')\n"
    "(work / 'target').mkdir()\n"
    "(work / 'target' / 'model.safetensors').write_bytes(b'x' * 1024)\n"
    "print(work)\n"
)


def _run(keep: bool) -> Path:
    env = {k: v for k, v in os.environ.items() if k != "PFLASH_KEEP_WORK"}
    if keep:
        env["PFLASH_KEEP_WORK"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", MAKE], env=env, capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


def test_work_folder_is_removed_when_the_bench_process_exits():
    work = _run(keep=False)
    assert work.name.startswith("pflash-test-")
    assert not work.exists()


def test_keep_work_leaves_the_folder_for_reading_logs():
    work = _run(keep=True)
    try:
        assert (work / "target" / "model.safetensors").stat().st_size == 1024
    finally:
        shutil.rmtree(work, ignore_errors=True)
