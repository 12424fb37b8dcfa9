#!/usr/bin/env bash
# Set up the environment, then run the whole test suite (unit + real-model + real Ray Serve).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
export RAY_AUTH_MODE=disabled
exec python -m pytest "$@"
