#!/usr/bin/env bash
# Makes a stand-in for the Dockerfile's base image (python:3.11.11-slim-bookworm) where the container registry
# cannot be reached: a Debian bookworm root made by debootstrap from Debian's packages, with Debian's Python 3.11,
# pip, venv and Python's headers, imported into the local Docker engine under a local name. Build the image on it
# with `--build-arg BASE_IMAGE=<that name>` (scripts/docker_build.sh does). Needs root, debootstrap and a
# running Docker engine; reaches only the Debian mirror.
#
#   bash scripts/docker_stand_in_base.sh            # prints the image's name; makes it unless it exists
#   bash scripts/docker_stand_in_base.sh --force    # makes it again
#
# How it differs from the python image: Python 3.11.2 from Debian (not 3.11.11 built from source) in /usr/bin,
# pip installs into /usr/local/lib/python3.11/dist-packages; `python` is python3 (python-is-python3); the
# "externally managed" marker is removed, so `python -m pip install` installs system-wide as it does in the
# python image. The Dockerfile's own steps (apt-get, useradd, pip) run unchanged on it.
set -euo pipefail

NAME="${TXL_STAND_IN_BASE:-txl-stand-in/python:3.11-bookworm}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PACKAGES=python3.11,python3-pip,python3-venv,python3.11-dev,python-is-python3,ca-certificates

say() { echo "stand-in base: $*" >&2; }

main() {
    local force=0
    [ "${1:-}" = "--force" ] && force=1
    if [ "$force" = 0 ] && docker image inspect "$NAME" >/dev/null 2>&1; then
        echo "$NAME"
        return 0
    fi
    if [ "$(id -u)" != 0 ]; then
        say "debootstrap needs root"
        exit 1
    fi
    command -v debootstrap >/dev/null || { say "needs debootstrap (apt-get install debootstrap)"; exit 1; }
    root="$(mktemp -d /tmp/txl-stand-in-base.XXXXXX)"
    trap 'rm -rf "$root"' EXIT
    local started=$SECONDS
    say "debootstrap bookworm from $MIRROR into $root (a few minutes)"
    debootstrap --variant=minbase --include="$PACKAGES" bookworm "$root" "$MIRROR" >"$root.log" 2>&1 || {
        tail -20 "$root.log" >&2
        exit 1
    }
    rm -f "$root.log"
    echo "deb $MIRROR bookworm main" >"$root/etc/apt/sources.list"
    rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
    rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/cache/apt/archives/*.deb
    say "importing as $NAME"
    tar -C "$root" --numeric-owner -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["python3"]' \
        - "$NAME" >/dev/null
    say "made $NAME in $((SECONDS - started)) s ($(docker image inspect -f '{{.Size}}' "$NAME" | awk '{printf "%.0f MB", $1/1e6}'))"
    echo "$NAME"
}

main "$@"
