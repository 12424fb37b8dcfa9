"""The package's arrows point down: what imports what, read from the source (issue 14).

- nothing under `pflash/` outside `pflash_lab/bench/` imports the benchmark harness, not even
  lazily inside a function (training and the CLI used to);
- nothing under `pflash/` imports Ray or the deployments: decisions stay testable without a
  cluster, and `deployments/` only carries;
- a product module over ~600 lines says why at its top;
- `pflash bench` still reaches the harness, through the `pflash.commands` entry point.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pflash"
LONG_MODULE_LINES = 620


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Every module name an `import` or `from ... import` anywhere in the file names."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def test_no_product_module_imports_the_benchmark_harness():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _within(n, "pflash_lab.bench")
        )
        for path in _modules()
        if PACKAGE / "bench" not in path.parents
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_the_library_imports_neither_ray_nor_the_deployments():
    offenders = {
        str(path.relative_to(ROOT)): sorted(
            n for n in _imports(path) if _within(n, "ray") or _within(n, "deployments")
        )
        for path in _modules()
        if PACKAGE / "bench" not in path.parents
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_long_product_modules_say_why_at_their_top():
    unexplained = []
    for path in _modules():
        if PACKAGE / "bench" in path.parents:
            continue
        text = path.read_text(encoding="utf-8")
        if text.count("\n") <= LONG_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "lines" not in doc:
            unexplained.append(str(path.relative_to(ROOT)))
    assert unexplained == []


def test_pflash_bench_is_reached_through_the_registered_command(capsys):
    from pflash.cli import main

    with pytest.raises(SystemExit) as done:
        main(["bench", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "run" in out and "smoke" in out and "ablate" in out
