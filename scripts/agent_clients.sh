#!/usr/bin/env bash
# The agent command-line clients the tests drive, installed from npm at pinned versions into
# .agent-clients/ (both ship their native binary inside the package: no download at run
# time). Idempotent: a later run only checks the versions. The versions are the ones the
# recorded request fixtures come from (tests/fixtures/agent_clients/clients.json); bump both
# together and re-record (python tests/fixtures/agent_clients/record.py).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null 2>&1; then
    echo "warning: npm not found: the agent-client tests (Claude Code, Codex CLI) will be skipped" >&2
    exit 0
fi
want=$(python3 -c 'import json; c = json.load(open("tests/fixtures/agent_clients/clients.json")); print(" ".join(f"{k}@{v}" for k, v in c["npm"].items()))')
stamp=.agent-clients/.installed
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
    && [ -x .agent-clients/node_modules/.bin/claude ] && [ -x .agent-clients/node_modules/.bin/codex ]; then
    exit 0
fi
mkdir -p .agent-clients
# shellcheck disable=SC2086
npm install --prefix .agent-clients --no-audit --no-fund --no-save --loglevel=error $want
echo "$want" > "$stamp"
