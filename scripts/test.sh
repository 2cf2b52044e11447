#!/usr/bin/env bash
# Installs everything the tests need into ./.venv, then runs the whole suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`); TXL_TEST_WORKERS=0 runs it in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh "server,train,dev,oracle,eval"
set +e
# Two worker processes, a file's tests in one of them (its fixtures are shared): most tests wait on servers,
# Redis or subprocesses, so two processes finish the suite sooner on two cores. The slowest tests are listed.
.venv/bin/python -m pytest -q -n "${TXL_TEST_WORKERS:-2}" --dist loadfile --durations=25 "$@"
status=$?
set -e
# pytest exits 5 when no test was collected (e.g. a -k filter that matches nothing): not a failure.
if [ "$status" -eq 5 ]; then
    echo "no tests collected"
    exit 0
fi
exit "$status"
