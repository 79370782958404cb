# specwatch images, from one Dockerfile (docker-compose.yml builds both):
#
#   api     the control plane: FastAPI app, `specwatch` CLI, the migrations (`specwatch db upgrade`). No torch.
#   worker  Celery workers that run the suite: torch, git, and transformers' runtime dependencies.
#
# Both install the project's wheel (stage `wheel`), as users install it: the api image with the `server` extra's
# requirements but without torch, numpy and scipy; the worker image with everything.
#
#   docker build --target api    -t specwatch-api .
#   docker build --target worker -t specwatch-worker:cuda .                                # CUDA torch (PyPI's Linux build)
#   docker build --target worker --build-arg TORCH_VARIANT=cpu -t specwatch-worker:cpu .   # CPU-only torch
#   docker build --target worker --build-arg TORCH_VARIANT=cu126 ...                       # one CUDA build from the PyTorch index
#   docker build --target worker --build-arg TORCH_INDEX_URL=https://mirror.example/simple ...   # any index
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

# ------------------------------------------------------------------------------------- requirements
# The dependency lists from pyproject.toml, so that installing them is a layer cached until it changes
# (the package's own code, copied later, changes far more often). The api's list is the `server` extra and the
# library's command-line requirements, without the suite's torch, numpy and scipy.
FROM base AS requirements
COPY pyproject.toml ./
RUN set -eu; \
    deps='import sys, tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; suite = ("torch", "numpy", "scipy"); base = [r for r in p["dependencies"] if sys.argv[1] == "worker" or not r.startswith(suite)]; print("\n".join(base + p["optional-dependencies"]["server"]))'; \
    python -c "$deps" api > requirements-api.txt; \
    python -c "$deps" worker > requirements-worker.txt

# -------------------------------------------------------------------------------------------- wheel
# The project's wheel: the library, the server and the migrations (service/migrations links to migrations/).
FROM base AS wheel
COPY pyproject.toml README.md ./
COPY specwatch ./specwatch
COPY service ./service
COPY workers ./workers
COPY migrations ./migrations
RUN pip wheel --no-deps --wheel-dir /dist .

# -------------------------------------------------------------------------------------- api (build)
FROM base AS api-build
RUN python -m venv /opt/venv
COPY --from=requirements /app/requirements-api.txt /tmp/requirements.txt
RUN pip install --requirement /tmp/requirements.txt
# The wheel without its dependencies (those are installed above): no torch, numpy or scipy in the control plane.
COPY --from=wheel /dist /dist
RUN pip install --no-deps /dist/*.whl \
    && if python -c 'import torch' 2>/dev/null; then echo "torch must not be in the api image" >&2; exit 1; fi

# ----------------------------------------------------------------------------------- worker (build)
FROM base AS worker-build
# Keep TORCH_VERSION equal to the Makefile's TORCH_SPEC (a test checks it).
ARG TORCH_VERSION=2.13.0
# cuda: PyPI's torch, whose Linux x86_64 wheels are CUDA builds; cpu, cuXYZ or rocmX.Y: that build from
# the PyTorch index. TORCH_INDEX_URL, when set, wins over TORCH_VARIANT.
ARG TORCH_VARIANT=cuda
ARG TORCH_INDEX_URL=
# The transformers release whose dependencies the worker carries (keep equal to the dev extra's pin).
ARG TRANSFORMERS_VERSION=5.24.0
RUN python -m venv /opt/venv
RUN set -eu; \
    index="${TORCH_INDEX_URL}"; \
    if [ -z "$index" ]; then \
        case "${TORCH_VARIANT}" in \
            cuda) index="https://pypi.org/simple" ;; \
            cpu|cu[0-9]*|rocm[0-9]*) index="https://download.pytorch.org/whl/${TORCH_VARIANT}" ;; \
            *) echo "TORCH_VARIANT must be cuda, cpu, cuXYZ or rocmX.Y, got '${TORCH_VARIANT}'" >&2; exit 1 ;; \
        esac; \
    fi; \
    pip install --index-url "$index" "torch==${TORCH_VERSION}"
# transformers' runtime dependencies, but not transformers itself: a run tests the commit's own tree (its
# src/ first on PYTHONPATH), never an installed copy. These are the dependencies of one release; commits far
# older than it may pin other versions (4.x wants huggingface-hub < 1.0): build another worker image for them
# with --build-arg TRANSFORMERS_VERSION=4.NN.0.
RUN pip install "transformers==${TRANSFORMERS_VERSION}" \
    && pip uninstall --yes transformers
COPY --from=requirements /app/requirements-worker.txt /tmp/requirements.txt
RUN pip install --requirement /tmp/requirements.txt
COPY --from=wheel /dist /dist
RUN pip install --no-deps /dist/*.whl \
    && python -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# -------------------------------------------------------------------------------------------- worker
FROM base AS worker
# git: mirrors and worktrees of the target repositories; ca-certificates: cloning over https; bubblewrap:
# the sandbox of the code under test (workers/sandbox.py).
RUN apt-get update \
    && apt-get install --yes --no-install-recommends git ca-certificates bubblewrap \
    && rm -rf /var/lib/apt/lists/*
COPY --from=worker-build /opt/venv /opt/venv
# The state directories exist, owned by the worker's user, so that named volumes mounted on them start with
# that ownership: git mirrors, and released versions installed for pip-mode runs.
RUN install --directory --owner specwatch --group specwatch \
        /var/lib/specwatch /var/lib/specwatch/mirrors /var/lib/specwatch/releases
ENV OMP_NUM_THREADS=1 \
    SPECWATCH_WORKER_MIRROR_DIR=/var/lib/specwatch/mirrors \
    SPECWATCH_WORKER_RELEASE_CACHE_DIR=/var/lib/specwatch/releases \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER specwatch
CMD ["celery", "-A", "workers.celery_app", "worker", "-Q", "gpu", "--concurrency", "1", "--loglevel", "INFO"]

# ----------------------------------------------------------------------------------------------- api
# Last, so that a plain `docker build .` gives the api image.
FROM base AS api
COPY --from=api-build /opt/venv /opt/venv
USER specwatch
EXPOSE 8000
CMD ["uvicorn", "--factory", "service.app:create_app", "--host", "0.0.0.0", "--port", "8000"]
