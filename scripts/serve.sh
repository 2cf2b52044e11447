#!/usr/bin/env bash
# Installs the server into ./.venv and starts it on the bundled default model with an embedded Redis.
# Extra arguments go to the server (e.g. `bash scripts/serve.sh --port 9000 --model /path/to/transfo-xl-wt103`).
# The server's log ends with the playground's and the API docs' addresses once it answers.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh server
if ! .venv/bin/python -c "import txl_server.__main__" 2>/dev/null; then
    echo "the server is not yet available in this revision" >&2
    exit 1
fi
echo "serve: starting the server (loading the model, starting a private Redis unless TXL_REDIS_URL is set)" >&2
exec .venv/bin/python -m txl_server "$@"
