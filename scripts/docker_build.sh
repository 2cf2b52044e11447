#!/usr/bin/env bash
# Builds the image, with or without the container registry and PyTorch's package index:
#
#   bash scripts/docker_build.sh cpu                      # -> txl-serve:0.1.0-cpu
#   bash scripts/docker_build.sh cuda [TAG] [-- ARGS...]  # -> txl-serve:0.1.0 (TAG to name it; ARGS to docker build)
#
# Where both are reachable this is the Dockerfile's own `docker build` with the default base and indexes. Else:
# - the base: BASE_IMAGE if set; else python:3.11.11-slim-bookworm if the engine has it, else the stand-in if the
#   engine has it (scripts/docker_stand_in_base.sh), else python:3.11.11-slim-bookworm if it can be pulled, else
#   the stand-in, made now (root and debootstrap; the Debian mirror);
# - the Python packages, for the CPU variant when PyTorch's CPU index does not answer, and for either with
#   LOCAL_INDEX=1 (for a build whose containers cannot reach PyPI as this machine does, e.g. behind a proxy whose
#   certificate only this machine trusts): all of them from a local package index (scripts/package_index.py:
#   torch, its CPU or CUDA build, and the server's dependencies, fetched with this machine's pip configuration)
#   served on loopback for the build, which then runs with `--network host`. Else the CUDA variant takes torch's
#   CUDA build from PyPI (about 3 GB of wheels) in the build.
# Exit status 3: no base image can be had (no registry, and no stand-in: not root, or no debootstrap).
set -euo pipefail
cd "$(dirname "$0")/.."

PYTORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
say() { echo "docker build: $*" >&2; }

# A docker command that builds with BuildKit: one with the buildx plugin (`docker build` is buildx since Docker 23),
# or a client older than 23, which drives the engine's built-in BuildKit itself (Debian bookworm's docker.io).
buildkit_docker() {
    local candidate major
    while read -r candidate; do
        if "$candidate" buildx version >/dev/null 2>&1; then
            echo "$candidate"
            return 0
        fi
        major="$("$candidate" version --format '{{.Client.Version}}' 2>/dev/null | cut -d. -f1)" || true
        if [[ "$major" =~ ^[0-9]+$ ]] && [ "$major" -lt 23 ]; then
            echo "$candidate"
            return 0
        fi
    done < <(type -ap docker | awk '!seen[$0]++')
    say "no docker command here builds with BuildKit: install the buildx plugin (docker-buildx)"
    return 1
}

answers() { python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10)' "$1" 2>/dev/null; }

choose_base() {
    local default stand_in
    default="$(sed -n 's/^ARG BASE_IMAGE=//p' Dockerfile)"
    stand_in="${TXL_STAND_IN_BASE:-txl-stand-in/python:3.11-bookworm}"
    if [ -n "${BASE_IMAGE:-}" ]; then
        echo "$BASE_IMAGE"
    elif "$docker" image inspect "$default" >/dev/null 2>&1; then
        echo "$default"
    elif "$docker" image inspect "$stand_in" >/dev/null 2>&1; then
        say "base: the stand-in $stand_in (the engine has no $default)"
        echo "$stand_in"
    elif timeout 120 "$docker" pull -q "$default" >/dev/null 2>&1; then
        echo "$default"
    else
        say "base: $default cannot be pulled; making the stand-in"
        PATH="$(dirname "$docker"):$PATH" bash scripts/docker_stand_in_base.sh || exit 3
    fi
}

main() {
    local variant="${1:-cuda}"
    shift || true
    local tag="txl-serve:0.1.0"
    [ "$variant" = cpu ] && tag="txl-serve:0.1.0-cpu"
    if [ $# -gt 0 ] && [ "$1" != -- ]; then
        tag="$1"
        shift
    fi
    [ "${1:-}" = -- ] && shift
    case "$variant" in cpu | cuda) ;; *) say "the variant is cpu or cuda, not $variant"; exit 2 ;; esac

    docker="$(buildkit_docker)"
    local base
    base="$(choose_base)"
    local args=(--build-arg VARIANT="$variant" --build-arg BASE_IMAGE="$base" -t "$tag")
    local why=""
    if [ "${LOCAL_INDEX:-0}" = 1 ]; then
        why="LOCAL_INDEX=1"
    elif [ "$variant" = cpu ] && ! answers "$PYTORCH_CPU_INDEX/"; then
        why="$PYTORCH_CPU_INDEX does not answer"
    fi
    if [ -n "$why" ]; then
        local python="${PYTHON:-.venv/bin/python}" dir="${PACKAGE_INDEX:-$HOME/.cache/txl/package-index}/$variant"
        [ -x "$python" ] || python=python3
        say "$why: the Python packages come from a local index in $dir"
        "$python" scripts/package_index.py build "$dir" --variant "$variant"
        local url
        fifo="$(mktemp -u)"
        mkfifo "$fifo"
        "$python" scripts/package_index.py serve "$dir" >"$fifo" &
        index_pid=$!
        trap 'kill "$index_pid" 2>/dev/null || true; rm -f "$fifo"' EXIT
        read -r url <"$fifo"
        args+=(--network host --build-arg TORCH_INDEX="$url" --build-arg PIP_INDEX_URL="$url")
    fi
    say "$docker build ${args[*]} $*"
    local started=$SECONDS
    DOCKER_BUILDKIT=1 "$docker" build --progress=plain "${args[@]}" "$@" . >&2
    say "built $tag in $((SECONDS - started)) s: $("$docker" image inspect -f '{{.Size}}' "$tag" \
        | awk '{printf "%.2f GB", $1/1e9}')"
}

main "$@"
