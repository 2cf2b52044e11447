#!/usr/bin/env bash
# Installs everything the tests need into ./.venv, then runs the suite's first stage: every test not marked `slow`
# (tests/stages.py). TXL_TEST_STAGE=slow runs the second stage (a minute or more each: load, faults, the Docker
# image, Triton's interpreter, ...), TXL_TEST_STAGE=all both; .ci/run runs both stages.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -k sessions`); naming tests (a path) or a marker (-m)
# runs what they select, whatever the stage. TXL_TEST_WORKERS=0 runs it in one process.
# Sourced (`source scripts/test.sh`), it only defines its functions: tests/scripts run them.
set -euo pipefail

# The pytest arguments that select TXL_TEST_STAGE's tests, one a line; none where the arguments choose tests.
stage_selection() {
    local arg
    for arg in "$@"; do
        if [ "$arg" = "-m" ] || [[ "$arg" == -m?* ]] || [ -e "${arg%%::*}" ]; then
            return 0
        fi
    done
    case "${TXL_TEST_STAGE:-first}" in
        first) printf '%s\n' -m "not slow" ;;
        slow) printf '%s\n' -m slow ;;
        all) ;;
        *)
            echo "TXL_TEST_STAGE must be first, slow or all, not '$TXL_TEST_STAGE'" >&2
            return 2
            ;;
    esac
}

main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    local select
    select="$(stage_selection "$@")"
    bash scripts/install.sh "server,samples,train,dev,oracle,eval"
    local args=()
    if [ -n "$select" ]; then
        mapfile -t args <<<"$select"
    fi
    local status=0
    # Two worker processes, a file's tests in one of them (its fixtures are shared): most tests wait on servers,
    # Redis or subprocesses, so two processes finish the suite sooner on two cores. The slowest tests are listed.
    .venv/bin/python -m pytest -q -n "${TXL_TEST_WORKERS:-2}" --dist loadfile --durations=40 "${args[@]}" "$@" \
        || status=$?
    if [ "${args[*]}" = "-m not slow" ]; then
        echo "the second stage, the tests marked slow (tests/stages.py), runs in CI; here:" \
            "TXL_TEST_STAGE=slow bash scripts/test.sh"
    fi
    # pytest exits 5 when no test was collected (e.g. a -k filter that matches nothing): not a failure.
    if [ "$status" -eq 5 ]; then
        echo "no tests collected"
        return 0
    fi
    return "$status"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
