#!/usr/bin/env bash
# PFlash against a real vLLM: set up, then run tests/upstream (pytest marker `vllm`).
#
#   scripts/test_vllm.sh [pytest args...]
#
# The project's venv (scripts/setup.sh), then vLLM's own venv and model directory
# (scripts/vllm_upstream.sh --prepare-only: first run ~3 min and ~3.4 GB, later runs a check),
# then the test module, which starts vLLM and the Serve app itself (~4-6 min on 2 CPUs).
#   PFLASH_VLLM_VENV      (.venv-vllm in the repo root)  vLLM's venv
#   PFLASH_VLLM_MODEL_DIR ($PFLASH_VLLM_VENV/model)      the HF directory vLLM loads
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
[ -x .venv/bin/python ] || bash scripts/setup.sh
export PFLASH_VLLM_VENV="${PFLASH_VLLM_VENV:-$ROOT/.venv-vllm}"
export PFLASH_VLLM_MODEL_DIR="${PFLASH_VLLM_MODEL_DIR:-$PFLASH_VLLM_VENV/model}"
PFLASH_VLLM_PREPARE_ONLY=1 scripts/vllm_upstream.sh
. .venv/bin/activate
export RAY_AUTH_MODE=disabled
exec python -m pytest -m vllm tests/upstream "$@"
