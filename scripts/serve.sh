#!/usr/bin/env bash
# Installs the server into ./.venv and starts it on the bundled default model with an embedded Redis.
# Extra arguments go to the server (e.g. `bash scripts/serve.sh --port 9000 --model /path/to/transfo-xl-wt103`).
# Sessions are kept in the user's data directory (~/.local/share/txl-serve/redis/MODEL, or under
# $XDG_DATA_HOME) and survive restarts; `bash scripts/serve.sh --ephemeral` (or TXL_EPHEMERAL=1) keeps them in a
# temporary directory deleted at shutdown. Ctrl-C lets running requests finish (TXL_SHUTDOWN_GRACE_SECONDS);
# a second Ctrl-C stops them at once.
# The server's log ends with the playground's and the API docs' addresses once it answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh server,samples  # samples: what the docs' samples import (openai)
if ! .venv/bin/python -c "import txl_server.__main__" 2>/dev/null; then
    echo "the server is not yet available in this revision" >&2
    exit 1
fi
echo "serve: starting the server (loading the model, starting a private Redis unless TXL_REDIS_URL is set;" \
    "it says where sessions are kept)" >&2
exec .venv/bin/python -m txl_server "$@"
