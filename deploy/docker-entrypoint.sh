#!/bin/sh
# The image's entry point (Dockerfile: ENTRYPOINT ["txl-entrypoint", "python", "-m", "txl_server"]): runs its
# arguments as the image's user, txl (uid 10001).
#
# Started as root (the image's default): gives /data to txl when something in it is not txl's (a bind mount of a
# host directory root made: `docker run -v /srv/txl:/data` creates a missing /srv/txl root-owned), then drops to
# txl. The server never runs as root. Started as another user (`--user`, Kubernetes' runAsUser), it runs as that
# user, and when the private Redis would keep its files in an unwritable /data it stops at once and says what to do.
set -eu
volume=/data

if [ "$(id -u)" = 0 ]; then
    if [ -d "$volume" ] && [ -n "$(find "$volume" ! -user txl -print -quit 2>/dev/null)" ]; then
        if chown -R txl:txl "$volume" 2>/dev/null; then
            echo "txl-entrypoint: $volume now belongs to txl (uid 10001), who runs the server" >&2
        else
            echo "txl-entrypoint: cannot give $volume to txl (uid 10001): mounted read-only?" >&2
        fi
    fi
    HOME=/home/txl exec setpriv --reuid=txl --regid=txl --init-groups --no-new-privs -- "$@"
fi

case "${TXL_REDIS_DATA_DIR:-}" in
    "$volume" | "$volume"/*)
        if [ -z "${TXL_REDIS_URL:-}" ] && [ -d "$volume" ] && [ ! -w "$volume" ]; then
            owner="$(stat -c %u:%g "$volume")"
            echo "txl-entrypoint: $volume (owner $owner) is not writable by uid $(id -u), and the private Redis" \
                "keeps sessions there: on the host, chown -R $(id -u):$(id -g) the directory mounted at $volume;" \
                "or start the container without --user (the entry point then does it); or mount a named volume" \
                "(-v txl-data:$volume)" >&2
            exit 2
        fi
        ;;
esac
exec "$@"
