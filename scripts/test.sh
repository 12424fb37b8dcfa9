#!/usr/bin/env bash
# Set up the environment, then run the whole test suite (unit + real-model + real Ray Serve).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The Prometheus integration test scrapes the running app with a real Prometheus server
# (Debian's package). Install it where we may; elsewhere that test says how.
if ! command -v prometheus >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus) >/dev/null 2>&1 \
        || echo "warning: could not install prometheus; tests/integration/test_prometheus.py will fail" >&2
fi
. .venv/bin/activate
export RAY_AUTH_MODE=disabled
exec python -m pytest "$@"
