#!/usr/bin/env bash
# The GPU run, in under 10 minutes, for the first GPU lent: `bash scripts/gpu-check.sh [OUT]` from a checkout whose
# Python has torch with CUDA (PYTHON=..., default python3; the checkout's packages are put on PYTHONPATH).
#
#   1. `python -m txl_server check --device cuda`: the served model (TXL_MODEL, else the bundled one) in TXL_DTYPE
#      (default bfloat16) through the server's own worker: the start-up checks (the Triton decoding body,
#      sampling included, against the torch path; every CUDA graph against eager), parity, and decoding at the
#      served mem_len against the floor of the weights and the memories' keys and values.
#   2. `python -m bench gpu`: the wt103 shape at its mem_len (1,600) against the same floor, graph and eager, 64
#      sessions in float32 and bfloat16, scoring; and `bench http`'s measurement with 64 concurrent streams, the
#      bundled model served by a real server process on the GPU (TTFT, ITL, tokens/s).
#
# Everything lands under OUT (default results/gpu-check-<UTC time>): environment.txt (GPU, driver, torch, the
# revision), check.txt and bench-gpu.txt (what each printed), the Markdown sections as the benchmarks write them
# (check/benchmarks/gpu.md, bench/benchmarks/gpu.md: copy them into docs/benchmarks/ to publish), summary.txt (each
# step's exit status and seconds). Each step has its own time limit, together under 10 minutes. Exit status: 0 when
# every step passed, 1 when one failed or ran out of time, 2 when there is no GPU (then nothing is measured).
set -uo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
CHECK_SECONDS=${CHECK_SECONDS:-230}
BENCH_SECONDS=${BENCH_SECONDS:-320}
DEVICE=${TXL_DEVICE:-cuda}
[[ $DEVICE == cuda* ]] || DEVICE=cuda
export PYTHONPATH="$PWD/model:$PWD/server:$PWD/clients/python:$PWD${PYTHONPATH:+:$PYTHONPATH}"

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
    "$PYTHON" -c 'import torch; print(f"torch {torch.__version__}, CUDA {torch.version.cuda}")'
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

step check "$CHECK_SECONDS" "$PYTHON" -m txl_server check --device "$DEVICE" \
    --dtype "${TXL_DTYPE:-bfloat16}" --write-benchmarks --docs "$OUT/check"
step bench-gpu "$BENCH_SECONDS" "$PYTHON" -m bench gpu --out "$OUT/bench"
echo "gpu-check: $([ "$failed" = 0 ] && echo "every step passed" || echo "a step FAILED"); see $OUT/summary.txt"
exit "$failed"
