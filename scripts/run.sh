#!/usr/bin/env bash
# Set up the environment, then start the PFlash Serve application on the embedded model
# (SmolLM2-135M as drafter and target) with `serve run serve_config.yaml`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export RAY_AUTH_MODE=disabled
exec serve run "${PFLASH_SERVE_CONFIG:-serve_config.yaml}" "$@"
