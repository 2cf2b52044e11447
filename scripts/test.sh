#!/usr/bin/env bash
# Installs everything the tests need into ./.venv, then runs the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "server,train,dev,oracle"
set +e
.venv/bin/python -m pytest -q "$@"
status=$?
set -e
# pytest exits 5 when no test was collected (e.g. a -k filter that matches nothing): not a failure.
if [ "$status" -eq 5 ]; then
    echo "no tests collected"
    exit 0
fi
exit "$status"
