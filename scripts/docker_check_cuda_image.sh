#!/usr/bin/env bash
# Builds the CUDA image and checks it, on any machine with a Docker engine (no GPU needed); too slow for CI (torch's
# CUDA build brings about 3 GB of wheels from PyPI):
#
#   bash scripts/docker_check_cuda_image.sh [TAG]        # default txl-serve:0.1.0
#   LOCAL_INDEX=1 bash scripts/docker_check_cuda_image.sh  # the wheels fetched here first (scripts/docker_build.sh)
#
# Checks, in the image, as its user (the entry point drops to txl): gcc is there (Triton compiles its launchers
# with it); triton imports; torch is the CUDA build docs/deploy.md names (CUDA_BUILD below); Triton's cache and
# txl's kernel cache in txl's home are writable, and a C extension compiles there against Python's headers (what
# Triton does on a GPU's first step). Then that `docker run` without `--gpus` stops at once with the one line that
# says so. On a host whose Docker engine has the NVIDIA runtime, also that torch sees the GPU with `--gpus all`.
set -euo pipefail
cd "$(dirname "$0")/.."

CUDA_BUILD=13.0 # torch 2.13.0's Linux x86_64 wheel on PyPI (the Dockerfile's and docs/deploy.md's figure)
tag="${1:-txl-serve:0.1.0}"
say() { echo "cuda image: $*" >&2; }

bash scripts/docker_build.sh cuda "$tag"

say "gcc, triton, torch's CUDA build, the caches, as the image's user"
docker run --rm -e CUDA_BUILD="$CUDA_BUILD" --entrypoint txl-entrypoint "$tag" python -c '
import os, shutil, subprocess, sysconfig, textwrap
from pathlib import Path
import torch, triton
assert os.getuid() == 10001, f"runs as uid {os.getuid()}, not txl (10001)"
gcc = shutil.which("gcc")
assert gcc, "no gcc: Triton cannot build its launchers"
assert torch.version.cuda == os.environ["CUDA_BUILD"], f"torch {torch.__version__} is built for CUDA {torch.version.cuda}"
home = Path.home()
triton_cache, txl_cache = home / ".triton" / "cache", home / ".cache" / "txl" / "kernels"
for cache in (triton_cache, txl_cache):
    cache.mkdir(parents=True, exist_ok=True)
    (cache / "probe").write_text("ok")
source = triton_cache / "probe.c"
source.write_text(textwrap.dedent("""
    #include <Python.h>
    static struct PyModuleDef probe = {PyModuleDef_HEAD_INIT, "probe", NULL, -1, NULL};
    PyMODINIT_FUNC PyInit_probe(void) { return PyModule_Create(&probe); }
"""))
include = sysconfig.get_paths()["include"]
subprocess.run([gcc, "-shared", "-fPIC", "-I", include, str(source), "-o", str(triton_cache / "probe.so")], check=True)
compiler = subprocess.run([gcc, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
print(f"uid 10001 ({home}), {compiler}, triton {triton.__version__}, torch {torch.__version__} "
      f"(CUDA {torch.version.cuda}), caches writable")
'

say "without --gpus: one line, exit 2"
set +e
output="$(docker run --rm "$tag" 2>&1)"
code=$?
set -e
echo "$output"
if [ "$code" != 2 ] || [ "$(echo "$output" | wc -l)" != 1 ] || [[ "$output" != *"--gpus all"* ]]; then
    say "expected exit 2 and one line naming --gpus all, got exit $code"
    exit 1
fi

if docker info --format '{{json .Runtimes}}' 2>/dev/null | grep -q nvidia; then
    say "with --gpus all"
    docker run --rm --gpus all --entrypoint python "$tag" -c \
        'import torch; assert torch.cuda.is_available(); print(torch.cuda.get_device_name(0))'
fi
say "$tag passes ($(docker image inspect -f '{{.Size}}' "$tag" | awk '{printf "%.2f GB", $1/1e9}'))"
