#!/usr/bin/env bash
# Installs TXL Serve into ./.venv with the given extras (default: server).
# torch comes first and pinned: `pip install torch==2.13.0` takes the local CPU wheel, while an unpinned
# torch pulled in by a dependency would download gigabytes of CUDA packages.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-server}"
python="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$python" -m venv .venv
fi
stamp=".venv/.txl-installed-$extras"
# pip warns about every missing local index directory; keep the log readable.
quiet() { "$@" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2); }
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ] || [ clients/python/pyproject.toml -nt "$stamp" ]; then
    quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check "torch==2.13.0"
    quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[$extras]"
    if [ -f clients/python/pyproject.toml ]; then
        quiet .venv/bin/python -m pip install --quiet --disable-pip-version-check -e clients/python
    fi
    touch "$stamp"
fi
