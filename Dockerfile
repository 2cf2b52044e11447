# TXL Serve: one server process per GPU, so run one container per GPU (docs/deploy.md).
#
#   GPU (default): docker build -t txl-serve:0.1.0 .
#   CPU only:      docker build -t txl-serve:0.1.0-cpu --build-arg VARIANT=cpu .
#
# Needs BuildKit (RUN --mount), with its built-in Dockerfile frontend: no `# syntax=` image to pull. Without the
# container registry or PyPI, scripts/docker_build.sh builds it on a stand-in base made from Debian's packages and
# a local package index (BASE_IMAGE, TORCH_INDEX, PIP_INDEX_URL below; docs/deploy.md).
#
# The model directory comes in by volume (-v /srv/models:/models:ro -e TXL_MODEL=/models/NAME); without
# TXL_MODEL the bundled default model is served. Every other setting is a TXL_* variable.
#
# tests/deploy/test_image.py reads this file and runs its pip commands and its start command in a fresh
# virtual environment (the cpu variant): the image paths /src, /wheels and /data become temp directories
# there, the apt-get line is checked against this machine's compiler instead of run, and a RUN line that is
# none of these makes that test fail until it learns it.

ARG VARIANT=cuda
# The image every stage starts from. The stand-in (scripts/docker_stand_in_base.sh) is Debian's own Python 3.11.
ARG BASE_IMAGE=python:3.11.11-slim-bookworm
# The torch the test suite runs (scripts/install.sh pins the same one; tests/deploy checks that they agree).
ARG TORCH_VERSION=2.13.0

# ---- bases: Python 3.11 and torch ${TORCH_VERSION}, its CUDA build or its CPU build. TORCH_INDEX is where torch
# comes from: PyPI's Linux x86_64 wheel is the CUDA build (2.13.0: CUDA 13.0, whose libraries come as wheels, so
# the host needs only an NVIDIA driver >= 580; for an older driver, another CUDA build of the same version, e.g.
# --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu126); PyTorch's CPU index has the CPU build.
FROM ${BASE_IMAGE} AS base-python
# A C compiler, for both variants. On a GPU, Triton (which torch's CUDA build brings) compiles its CUDA driver
# module and each kernel's launcher with the system compiler on first use, against Python's headers (this image
# has those); without one every decode step fails ("Failed to find C compiler"). On a CPU, txl's native kernels
# (attention, the fused decode layer, the few-row linear loop) are compiled for the machine the container runs on
# (-march=native, so not at build time) on first use; without a compiler the server takes torch's paths, which
# decoded 2.3x slower (docs/deploy.md). gcc brings binutils and libgomp (the kernels' OpenMP); libc6-dev the C headers and
# start files. Pinned to bookworm's series: libc6-dev must equal the image's libc6 exactly, and Debian's point
# releases move that, so an exact pin would stop building at the next one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends "gcc=4:12.2.0-*" "libc6-dev=2.36-*" \
    && rm -rf /var/lib/apt/lists/*

FROM base-python AS base-cuda
ARG TORCH_VERSION
ARG TORCH_INDEX=https://pypi.org/simple
RUN python -m pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
# What the NVIDIA container runtime exposes to the container: the GPUs it is given, for computing.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    TXL_DEVICE=cuda \
    TXL_DTYPE=bfloat16

FROM base-python AS base-cpu
ARG TORCH_VERSION
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN python -m pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch==${TORCH_VERSION}"
ENV TXL_DEVICE=cpu \
    TXL_DTYPE=float32

# ---- build: the project (and the Python client, where the repo has one) as wheels; no source in the image
FROM ${BASE_IMAGE} AS build
# Where pip finds the build backend here, and the server's dependencies in the runtime stage.
ARG PIP_INDEX_URL=https://pypi.org/simple
WORKDIR /src
# .dockerignore lets in only what the wheels are built from.
COPY . .
RUN python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && if [ -f clients/python/pyproject.toml ]; then python -m pip wheel --no-cache-dir --no-deps --wheel-dir /wheels ./clients/python; fi \
    && cp deploy/constraints.txt /wheels/constraints.txt

# ---- runtime (base-${VARIANT} is one of the pinned bases above, which hadolint cannot see)
# hadolint ignore=DL3006
FROM base-${VARIANT} AS runtime
LABEL org.opencontainers.image.title="TXL Serve" \
      org.opencontainers.image.description="Stateful Transformer-XL inference server" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="0.1.0"
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1
ARG PIP_INDEX_URL=https://pypi.org/simple
# The server extra without dev tools; deploy/constraints.txt pins the server's dependencies (torch and what it
# brought in the base stage stay as they are).
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --constraint /wheels/constraints.txt /wheels/*.whl "txl-serve[server]"
# The entry point starts as root only to give /data to txl when it is not (a bind mount of a root-owned host
# directory), then runs the server as txl (uid 10001); started with --user (Kubernetes' runAsUser) it runs as that
# user (deploy/docker-entrypoint.sh).
RUN --mount=type=bind,from=build,source=/src/deploy/docker-entrypoint.sh,target=/mnt/docker-entrypoint.sh \
    useradd --create-home --uid 10001 --user-group txl \
    && mkdir -p /models /data/redis /data/blocks \
    && chown -R 10001:10001 /data \
    && install -m 0755 /mnt/docker-entrypoint.sh /usr/local/bin/txl-entrypoint
# Flags in CMD win over these; they are here so that `docker run IMAGE --model ...` (a new CMD) still listens
# on all interfaces. The embedded Redis (used when TXL_REDIS_URL is unset) keeps its append-only file in /data, and
# sessions' memories go to the block store in /data/blocks (a volume shared by the replicas, or an object store
# URL in TXL_BLOCK_STORE).
ENV TXL_HOST=0.0.0.0 \
    TXL_PORT=8000 \
    TXL_REDIS_DATA_DIR=/data/redis \
    TXL_BLOCK_STORE=/data/blocks
WORKDIR /home/txl
EXPOSE 8000
# The probe reads the server's --host and --port from its command line (and TXL_HOST, TXL_PORT): `docker run
# IMAGE --port 9000` turns healthy too. It asks /health, liveness: unhealthy once the device failed or the worker
# is stuck (docs/server.md, "Liveness").
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-m", "txl_server.healthcheck"]
ENTRYPOINT ["txl-entrypoint", "python", "-m", "txl_server"]
CMD ["--host", "0.0.0.0", "--port", "8000"]
