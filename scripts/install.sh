#!/usr/bin/env bash
# Installs TXL Serve into ./.venv with the given extras (default: server), saying what it does on stderr.
# torch comes first and pinned (an unpinned torch pulled in by a dependency could be any build). Which build: on
# a machine without an NVIDIA GPU the CPU build, from PyTorch's CPU index (PyPI's Linux x86_64 wheel is the CUDA
# build, with gigabytes of CUDA libraries); when that index does not answer, pip's default index and find-links,
# with a note; with an NVIDIA GPU, the default index. TORCH_INDEX=URL chooses the index (a mirror);
# TORCH_CPU_INDEX is the CPU index tried. Before installing it says which wheel pip chose (its version, the CPU or
# the CUDA build, and where from), and while a step runs it says every 15 s that it still does.
# An environment already installed with these extras, or with more (the tests' set includes the server's), is
# left as it is until pyproject.toml changes.
# Sourced (`source scripts/install.sh`), it only defines its functions: tests/scripts run them.
set -euo pipefail

TORCH_PIN="torch==2.13.0"

say() { echo "install: $*" >&2; }

has_nvidia_gpu() {
    [ -e /proc/driver/nvidia/version ] || nvidia-smi -L >/dev/null 2>&1
}

answers() {
    "${PYTHON:-python3}" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$1" \
        >/dev/null 2>&1
}

# The index to install torch from (printed; empty: pip's default index), and why (on stderr).
torch_index() {
    local cpu_index="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"
    if [ -n "${TORCH_INDEX:-}" ]; then
        say "torch from TORCH_INDEX=$TORCH_INDEX"
        echo "$TORCH_INDEX"
    elif has_nvidia_gpu; then
        say "an NVIDIA GPU is here: torch from the default index (PyPI's Linux x86_64 wheel is the CUDA build)"
    elif answers "$cpu_index/"; then
        say "no NVIDIA GPU here: torch's CPU build, from $cpu_index"
        echo "$cpu_index"
    else
        say "no NVIDIA GPU here, but $cpu_index does not answer: torch from pip's default index and find-links" \
            "instead (TORCH_INDEX=URL names a mirror of the CPU index)"
    fi
}

# Which torch wheel the pip command given (its arguments, then the index's) would install, from pip's own
# resolution (`--dry-run --report`): its version, the CPU or the CUDA build, and where it comes from; "installed"
# where the pinned torch is there already; nothing where pip cannot tell (an older pip, no answer from the index).
torch_wheel() {
    "$@" --dry-run --no-deps --quiet --report - "$TORCH_PIN" 2>/dev/null | "${PYTHON:-python3}" -c '
import json, sys, urllib.parse
try:
    chosen = json.load(sys.stdin)["install"]
except (ValueError, KeyError):
    sys.exit(0)
if not chosen:
    print("installed")
    sys.exit(0)
version = chosen[0]["metadata"]["version"]
url = chosen[0]["download_info"]["url"]
if url.startswith("file://"):
    origin = "the local file " + urllib.parse.unquote(url[len("file://"):])
else:
    origin = urllib.parse.urlsplit(url).netloc
cpu = "+cpu" in version
build = "the CPU build" if cpu else "its default build: on Linux x86_64 the CUDA build, with gigabytes of CUDA libraries"
print(f"torch {version} from {origin}: {build}")
' || true
}

# Runs a command, saying every PROGRESS_SECONDS (15) that `what` is still under way (pip is quiet while it
# downloads and unpacks).
with_progress() {
    local what="$1" every="${PROGRESS_SECONDS:-15}"
    shift
    "$@" &
    local pid=$! waited=0 status=0
    while kill -0 "$pid" 2>/dev/null; do
        sleep 1
        waited=$((waited + 1))
        if ((waited % every == 0)) && kill -0 "$pid" 2>/dev/null; then
            say "$what: still under way (${waited} s)"
        fi
    done
    wait "$pid" || status=$?
    return "$status"
}

# Installs torch with the pip command given (its arguments), from the index torch_index chooses.
install_torch() {
    local index
    index="$(torch_index)"
    local wheel
    wheel="$(torch_wheel "$@" ${index:+--index-url "$index"})"
    if [ "$wheel" = installed ]; then
        say "$TORCH_PIN is installed already"
    else
        [ -z "$wheel" ] || say "$wheel"
        say "installing $TORCH_PIN (the largest package: a minute or more)"
    fi
    with_progress "installing torch" pip_quietly "$@" ${index:+--index-url "$index"} "$TORCH_PIN"
}

# Whether .venv holds these extras already: an install stamp for them, or for a set that includes them, newer
# than the project's pyproject files.
installed_already() {
    local wanted="$1" stamp extras extra
    for stamp in .venv/.txl-installed-*; do
        [ -f "$stamp" ] || continue
        [ ! pyproject.toml -nt "$stamp" ] && [ ! clients/python/pyproject.toml -nt "$stamp" ] || continue
        extras=",${stamp#.venv/.txl-installed-},"
        local covered=1
        for extra in ${wanted//,/ }; do
            [[ "$extras" == *",$extra,"* ]] || covered=0
        done
        [ "$covered" = 1 ] && return 0
    done
    return 1
}

# Says which build of torch a Python has.
say_torch_build() {
    "$1" -W ignore::UserWarning -c 'import torch
cuda = torch.version.cuda
print(f"torch {torch.__version__} installed: " + (f"the CUDA {cuda} build" if cuda else "the CPU build"))' \
        | while read -r line; do say "$line"; done
}

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
    if installed_already "$extras"; then
        return 0
    fi
    if [ ! -x .venv/bin/python ]; then
        say "creating a virtual environment in .venv"
        "$python" -m venv .venv
    fi
    local pip=(.venv/bin/python -m pip install --quiet --disable-pip-version-check)
    say "installing into .venv (the first time takes a few minutes): pip"
    pip_quietly "${pip[@]}" --upgrade pip
    install_torch "${pip[@]}"
    say "installing TXL Serve [$extras] and what it needs"
    with_progress "installing TXL Serve [$extras]" pip_quietly "${pip[@]}" -e ".[$extras]"
    if [ -f clients/python/pyproject.toml ]; then
        say "installing the Python client and the txl command"
        pip_quietly "${pip[@]}" -e clients/python
    fi
    say_torch_build .venv/bin/python
    touch "$stamp"
    say "done"
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    main "$@"
fi
