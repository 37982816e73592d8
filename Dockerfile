# syntax=docker/dockerfile:1
# accelbench: the pipeline in a CUDA container whose driver requirement matches torch's build.
#
#   docker build -t accelbench .                 # torch 2.14.1 from PyPI: CUDA 13.0, driver >= 580
#   docker run --rm --gpus all -v "$PWD:/workspace" accelbench      # runs `dvc repro`
#
# Another CUDA flavour of torch (PyTorch's own index) with the matching base image:
#   docker build --build-arg CUDA_VERSION=12.8.1 --build-arg TORCH_CUDA=cu128 -t accelbench:cu128 .
# torch wheels bundle their CUDA libraries, so the base is CUDA's `base` flavour (no toolkit);
# it sets NVIDIA_REQUIRE_CUDA, so the container runtime refuses a driver that is too old.

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=24.04

FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU} AS runtime
# cu130 = the lock's torch from PyPI; cu126 / cu128 / ... = torch from PyPI's download.pytorch.org index
ARG TORCH_CUDA=cu130
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential git \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, from the same lock as `make setup` and CI: this layer is cached until
# requirements.lock changes.
COPY requirements.lock /tmp/requirements.lock
RUN python3 -m venv /opt/venv \
    && if [ "$TORCH_CUDA" = "cu130" ]; then \
         pip install -r /tmp/requirements.lock; \
       else \
         grep -vE '^(torch|torchvision|triton|nvidia-|cuda-)' /tmp/requirements.lock > /tmp/no-torch.lock \
         && pip install -r /tmp/no-torch.lock \
         && pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" \
              "$(grep '^torch==' /tmp/requirements.lock)" "$(grep '^torchvision==' /tmp/requirements.lock)"; \
       fi

RUN useradd --create-home --uid 1000 --shell /bin/bash dev
WORKDIR /workspace
COPY --chown=1000:1000 . /opt/accelbench
RUN pip install --no-deps --no-build-isolation -e /opt/accelbench \
    && chown -R 1000:1000 /opt/venv
USER 1000

# The MLflow UI (`make ui HOST=0.0.0.0`, or `mlflow server --host 0.0.0.0`).
EXPOSE 5000
# `accelbench doctor`, then `dvc repro` in the checkout mounted at /workspace (or the image's copy).
CMD ["/opt/accelbench/docker/run-pipeline.sh"]

# The devcontainer: the same runtime plus shell comforts; the test tools (pytest, ruff,
# hadolint) come from the lock already.
FROM runtime AS dev
USER 0
RUN apt-get update \
    && apt-get install -y --no-install-recommends make less sudo \
    && rm -rf /var/lib/apt/lists/* \
    && echo "dev ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/dev
USER 1000
