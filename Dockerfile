# specwatch images, from one Dockerfile; docker-compose.yml builds each once (the api service the api image,
# the housekeeping worker the worker image) and the other services run them by name:
#
#   api     the control plane: FastAPI app, `specwatch` CLI, the migrations (`specwatch db upgrade`). No torch.
#   worker  Celery workers that run the suite: torch, git, bubblewrap and transformers' runtime dependencies.
#
#   docker build --target api    -t specwatch-api .
#   docker build --target worker -t specwatch-worker:cuda .                                # CUDA torch (PyPI's Linux build)
#   docker build --target worker --build-arg TORCH_VARIANT=cpu -t specwatch-worker:cpu .   # torch==V+cpu, from the PyTorch index
#   docker build --target worker --build-arg TORCH_VARIANT=cu126 ...                       # one CUDA build from the PyTorch index
#   docker build --target worker --build-arg TORCH_VARIANT=cpu --build-arg TORCH_INDEX_URL=http://mirror/simple ...
#
# Both install the project's wheel (built in the `wheel` stage), not the source tree. Build arguments for
# pip, every build stage: PIP_INDEX_URL (replaces PyPI), PIP_EXTRA_INDEX_URL, PIP_TRUSTED_HOST, PIP_FIND_LINKS;
# TORCH_INDEX_URL (an extra index torch comes from). A CA bundle and a wheelhouse go in compose/pip/ (see its
# README.md). None of them reaches the images.
#
# Both run as the unprivileged user `specwatch` (uid 10001); the virtual environment (/opt/venv) is
# root-owned and read-only to it. A worker's state lives in volumes under /var/lib/specwatch (mirrors, releases).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---------------------------------------------------------------------------------------------- base
FROM ${PYTHON_IMAGE} AS base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN groupadd --system --gid 10001 specwatch \
    && useradd --system --uid 10001 --gid specwatch --create-home --home-dir /home/specwatch \
       --shell /usr/sbin/nologin specwatch
WORKDIR /app

# --------------------------------------------------------------------------------------------- wheel
# The project's wheel (the library, the server and the migrations: service/migrations links to migrations/),
# and the dependency lists of both images from pyproject.toml (installed in layers of their own, cached until
# pyproject.toml changes): the api's is the `server` extra and the library's command-line requirements without
# the suite's torch, numpy and scipy; the worker's everything.
FROM base AS wheel
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
COPY compose/pip/ /pip/
COPY pyproject.toml README.md ./
RUN python /pip/requirements.py api > /pip/requirements-api.txt \
    && python /pip/requirements.py worker > /pip/requirements-worker.txt
COPY specwatch ./specwatch
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
RUN . /pip/pip-env.sh && python -m pip wheel --no-deps --wheel-dir /pip/dist .

# -------------------------------------------------------------------------------------- api (build)
FROM base AS api-build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
COPY compose/pip/ /pip/
RUN python -m venv /opt/venv
COPY --from=wheel /pip/requirements-api.txt /tmp/requirements.txt
RUN . /pip/pip-env.sh && pip install --requirement /tmp/requirements.txt

# ----------------------------------------------------------------------------------- worker (build)
FROM base AS worker-build
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_TRUSTED_HOST
ARG PIP_FIND_LINKS
# Keep TORCH_VERSION equal to the Makefile's TORCH_SPEC (a test checks it).
ARG TORCH_VERSION=2.13.0
# cuda: torch==TORCH_VERSION from the package index (PyPI's Linux x86_64 wheels are CUDA builds); cpu, cuXYZ
# or rocmX.Y: torch==TORCH_VERSION+VARIANT from TORCH_INDEX_URL, by default that build's PyTorch index. The
# torch index is an extra index: torch's own dependencies come from the package index.
ARG TORCH_VARIANT=cuda
ARG TORCH_INDEX_URL=
# The transformers release whose dependencies the worker carries (keep equal to the dev extra's pin), and gguf's
# (the llama.cpp target writes its fixture models as GGUF; keep equal to the dev extra's pin).
ARG TRANSFORMERS_VERSION=5.24.0
ARG GGUF_VERSION=0.19.0
COPY compose/pip/ /pip/
RUN python -m venv /opt/venv
RUN set -eu; . /pip/pip-env.sh; \
    index="${TORCH_INDEX_URL}"; \
    case "${TORCH_VARIANT}" in \
        cuda) spec="torch==${TORCH_VERSION}" ;; \
        cpu|cu[0-9]*|rocm[0-9]*) spec="torch==${TORCH_VERSION}+${TORCH_VARIANT}"; index="${index:-https://download.pytorch.org/whl/${TORCH_VARIANT}}" ;; \
        *) echo "TORCH_VARIANT must be cuda, cpu, cuXYZ or rocmX.Y, got '${TORCH_VARIANT}'" >&2; exit 1 ;; \
    esac; \
    if [ -n "$index" ]; then export PIP_EXTRA_INDEX_URL="${PIP_EXTRA_INDEX_URL:+$PIP_EXTRA_INDEX_URL }$index"; fi; \
    pip install "$spec"
# transformers with its runtime dependencies, and gguf: the llama.cpp target builds its tiny fixture models with
# them (specwatch/targets/llamacpp/models.py). A transformers run never tests this copy: a commit's own tree (its src/)
# and a release's folder come first on PYTHONPATH and shadow it. These are the dependencies of one release; commits
# far older than it may pin other versions (4.x wants huggingface-hub < 1.0): build another worker image for them
# with --build-arg TRANSFORMERS_VERSION=4.NN.0.
RUN . /pip/pip-env.sh && pip install "transformers==${TRANSFORMERS_VERSION}" "gguf==${GGUF_VERSION}"
COPY --from=wheel /pip/requirements-worker.txt /tmp/requirements.txt
RUN . /pip/pip-env.sh && pip install --requirement /tmp/requirements.txt
RUN python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# -------------------------------------------------------------------------------------------- worker
FROM base AS worker
# git: mirrors and worktrees of the target repositories; ca-certificates: cloning over https; bubblewrap:
# the sandbox of the code under test (workers/sandbox.py); cmake, g++ and ninja-build: the llama.cpp target compiles
# the llama.cpp tree a llama-cpp-python release vendors, or a checkout (specwatch/targets/llamacpp/build.py:
# BUILD_COMMANDS), once per version into the release cache.
RUN apt-get update \
    && apt-get install --yes --no-install-recommends git ca-certificates bubblewrap cmake g++ ninja-build \
    && rm -rf /var/lib/apt/lists/*
# CUDA_TOOLKIT: the CUDA compiler for the llama.cpp target's CUDA build (GGML_CUDA=ON, chosen where the worker sees
# a GPU: specwatch/targets/llamacpp/build.py cuda_device). Empty (the default): none, and llama.cpp builds for the
# CPU. A version MAJOR-MINOR (12-6, one the host's driver supports) installs nvcc, the CUDA runtime, cuBLAS and
# the driver stub from NVIDIA's Debian 12 x86_64 repository (CUDA_REPOSITORY; its keyring verifies them) under
# /usr/local/cuda, on PATH. The GPU's driver comes from the host (the NVIDIA Container Toolkit), as for torch.
ARG CUDA_TOOLKIT=
ARG CUDA_REPOSITORY=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64
RUN set -eu; \
    if [ -n "${CUDA_TOOLKIT}" ]; then \
        python -c 'import re, sys; sys.exit(not re.fullmatch(r"[0-9]+-[0-9]+", sys.argv[1]))' "${CUDA_TOOLKIT}" \
            || { echo "CUDA_TOOLKIT must be empty or a CUDA version MAJOR-MINOR such as 12-6, got '${CUDA_TOOLKIT}'" >&2; exit 1; }; \
        python -c 'import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], "/tmp/cuda-keyring.deb")' \
            "${CUDA_REPOSITORY}/cuda-keyring_1.1-1_all.deb"; \
        dpkg -i /tmp/cuda-keyring.deb && rm /tmp/cuda-keyring.deb; \
        apt-get update; \
        apt-get install --yes --no-install-recommends "cuda-nvcc-${CUDA_TOOLKIT}" "cuda-cudart-dev-${CUDA_TOOLKIT}" \
            "cuda-cccl-${CUDA_TOOLKIT}" "cuda-driver-dev-${CUDA_TOOLKIT}" "libcublas-dev-${CUDA_TOOLKIT}"; \
        rm -rf /var/lib/apt/lists/*; \
        ln -sfn "/usr/local/cuda-$(echo "${CUDA_TOOLKIT}" | tr - .)" /usr/local/cuda; \
        /usr/local/cuda/bin/nvcc --version; \
    fi
COPY --from=worker-build /opt/venv /opt/venv
# The project's wheel last, without its dependencies (above): a change of the code rebuilds this small layer only.
COPY --from=wheel /pip/dist /tmp/dist
RUN pip install --no-deps /tmp/dist/specwatch-*.whl && rm -rf /tmp/dist
# The state directories exist, owned by the worker's user, so that named volumes mounted on them start with
# that ownership: git mirrors, and released versions installed for pip-mode runs.
RUN install --directory --owner specwatch --group specwatch \
        /var/lib/specwatch /var/lib/specwatch/mirrors /var/lib/specwatch/releases
ENV OMP_NUM_THREADS=1 \
    PATH=$PATH:/usr/local/cuda/bin \
    SPECWATCH_WORKER_MIRROR_DIR=/var/lib/specwatch/mirrors \
    SPECWATCH_WORKER_RELEASE_CACHE_DIR=/var/lib/specwatch/releases \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER specwatch
CMD ["celery", "-A", "workers.celery_app", "worker", "-Q", "gpu", "--concurrency", "1", "--loglevel", "INFO"]

# ----------------------------------------------------------------------------------------------- api
# Last, so that a plain `docker build .` gives the api image.
FROM base AS api
COPY --from=api-build /opt/venv /opt/venv
# The wheel without its dependencies (those are installed above): no torch, numpy or scipy in the control plane.
COPY --from=wheel /pip/dist /tmp/dist
RUN pip install --no-deps /tmp/dist/specwatch-*.whl && rm -rf /tmp/dist \
    && if python -c 'import torch' 2>/dev/null; then echo "torch must not be in the api image" >&2; exit 1; fi
USER specwatch
EXPOSE 8000
CMD ["uvicorn", "--factory", "service.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
