#!/usr/bin/env bash
# Installs TXL Serve into ./.venv with the given extras (default: server), saying what it does on stderr.
# torch comes first and pinned (an unpinned torch pulled in by a dependency could be any build). Which build: on
# a machine without an NVIDIA GPU the CPU build, from PyTorch's CPU index (PyPI's Linux x86_64 wheel is the CUDA
# build, with gigabytes of CUDA libraries); when that index does not answer, the default index, with a note; with
# an NVIDIA GPU, the default index. TORCH_INDEX=URL chooses the index (a mirror); TORCH_CPU_INDEX is the CPU
# index tried. It says which build it installed.
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
        say "no NVIDIA GPU here, but $cpu_index does not answer: torch from the default index instead. Note: on" \
            "Linux x86_64 PyPI's wheel is the CUDA build (gigabytes), unless pip finds a CPU wheel first (its" \
            "find-links); TORCH_INDEX=URL names a mirror of the CPU index"
    fi
}

# Installs torch with the pip command given (its arguments), from the index torch_index chooses.
install_torch() {
    local index
    index="$(torch_index)"
    say "installing $TORCH_PIN"
    pip_quietly "$@" ${index:+--index-url "$index"} "$TORCH_PIN"
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
    install_torch "${pip[@]}"
    say "installing TXL Serve [$extras]"
    pip_quietly "${pip[@]}" -e ".[$extras]"
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
