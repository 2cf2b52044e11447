#!/usr/bin/env bash
# Installs TXL Serve into ./.venv with the given extras (default: server), saying what it does on stderr.
# torch comes first and pinned: `pip install torch==2.13.0` takes the local CPU wheel, while an unpinned
# torch pulled in by a dependency would download gigabytes of CUDA packages.
# Sourced (`source scripts/install.sh`), it only defines its functions: tests/scripts run `pip_quietly` itself.
set -euo pipefail

say() { echo "install: $*" >&2; }

# pip with a readable log: pip warns about every missing local index directory, and setuptools prints a
# multi-line "Editable installation" warning block for each `pip install -e` (advice for its developers, not
# for someone setting up this project).
pip_quietly() {
    PYTHONWARNINGS="ignore:Editable installation:UserWarning" "$@" \
        2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
}

main() {
    cd "$(dirname "${BASH_SOURCE[0]}")/.."
    local extras="${1:-server}"
    local python="${PYTHON:-python3}"
    local stamp=".venv/.txl-installed-$extras"
    if [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! clients/python/pyproject.toml -nt "$stamp" ]; then
        return 0
    fi
    if [ ! -x .venv/bin/python ]; then
        say "creating a virtual environment in .venv"
        "$python" -m venv .venv
    fi
    local pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
    say "installing into .venv (the first time takes a few minutes): pip"
    pip_quietly "${pip[@]}" --upgrade pip
    say "installing torch 2.13.0 (CPU build)"
    pip_quietly "${pip[@]}" "torch==2.13.0"
    say "installing TXL Serve [$extras]"
    pip_quietly "${pip[@]}" -e ".[$extras]"
    if [ -f clients/python/pyproject.toml ]; then
        say "installing the Python client and the txl command"
        pip_quietly "${pip[@]}" -e clients/python
    fi
    touch "$stamp"
    say "done"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
