# accelbench: the pipeline in a CUDA container whose driver requirement matches torch's build.
#
#   docker build -t accelbench .                 # torch 2.14.1 from PyPI: CUDA 13.0, driver >= 580
#   docker run --rm --gpus all -v "$PWD:/workspace" accelbench      # runs `dvc repro`
#
# Another CUDA flavour of torch (PyTorch's own index) with the matching base image:
#   docker build --build-arg CUDA_VERSION=12.8.1 --build-arg TORCH_CUDA=cu128 -t accelbench:cu128 .
# torch wheels bundle their CUDA libraries, so the base is CUDA's `base` flavour (no toolkit);
# it sets NVIDIA_REQUIRE_CUDA, so the container runtime refuses a driver that is too old.
# No `# syntax=` line: that would make BuildKit fetch a frontend image before building, and
# nothing but the base image should need a registry.

ARG CUDA_VERSION=13.0.1
ARG UBUNTU=24.04

FROM nvidia/cuda:${CUDA_VERSION}-base-ubuntu${UBUNTU} AS runtime
# cu130 = the lock's torch from PyPI; cu126 / cu128 / ... = torch from PyTorch's own index
ARG TORCH_CUDA=cu130
# A flavour is a pair, the base image's CUDA and torch's build for it (12.8.x: cu128); the
# devcontainer takes both from the host's environment, so a mismatch is refused here.
ARG CUDA_VERSION
RUN minor="${CUDA_VERSION%.*}" && expected="cu${minor%%.*}${minor#*.}" \
    && if [ "$expected" != "$TORCH_CUDA" ]; then \
         echo "TORCH_CUDA=$TORCH_CUDA does not match CUDA_VERSION=$CUDA_VERSION (use $expected)" >&2; \
         exit 1; \
       fi
# PYTHONPATH: the checkout mounted at /workspace is the code that runs (the image's copy when
# none is mounted), so nothing is installed at start and any uid can run the image.
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    MLFLOW_DISABLE_TELEMETRY=true \
    DO_NOT_TRACK=true \
    VIRTUAL_ENV=/opt/venv \
    ACCELBENCH_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/workspace/src
# setpriv (util-linux) lets the entry point drop root for the checkout's owner.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
         python3 python3-venv python3-dev build-essential git util-linux ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# Dependencies first, from the same uv.lock as `make setup` and CI (runtime group, the `plots`
# and `team` extras, hashes checked), in one layer owned by root and readable by every uid: cached
# until the lock changes. uv (the lock's version, in a throwaway venv) exports and installs;
# the dev group's list stays beside the venv for the `dev` target. UV_SYSTEM_CERTS: the system's trust store.
ARG UV_VERSION=0.13.9
COPY pyproject.toml uv.lock docker/requirements_for_flavour.py /tmp/lock/
RUN python3 -m venv /opt/venv /tmp/uv \
    && /tmp/uv/bin/pip install --quiet "uv==${UV_VERSION}" \
    && export UV_SYSTEM_CERTS=1 UV_NO_CACHE=1 \
    && /tmp/uv/bin/uv export --project /tmp/lock --frozen --no-header --no-annotate --quiet \
         --no-emit-project --no-dev --extra plots --extra team -o /tmp/lock/runtime.txt \
    && /tmp/uv/bin/uv export --project /tmp/lock --frozen --no-header --no-annotate --quiet \
         --no-emit-project --only-group dev -o /opt/venv/dev-requirements.txt \
    && python3 /tmp/lock/requirements_for_flavour.py "$TORCH_CUDA" /tmp/lock/runtime.txt /tmp/lock \
    && /tmp/uv/bin/uv pip install --python /opt/venv/bin/python --require-hashes \
         --compile-bytecode -r /tmp/lock/requirements.txt \
    && if [ -s /tmp/lock/torch.txt ]; then \
         pip install --index-url "https://download.pytorch.org/whl/${TORCH_CUDA}" -r /tmp/lock/torch.txt; \
       fi \
    && rm -rf /tmp/lock /tmp/uv

# Ubuntu's images come with a user `ubuntu` at uid 1000: the image's user `dev` takes it over.
RUN if id -u ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --create-home --uid 1000 --shell /bin/bash dev
COPY . /opt/accelbench
RUN pip install --no-deps --no-build-isolation -e /opt/accelbench
WORKDIR /workspace

# The MLflow UI (`make ui HOST=0.0.0.0`, or `mlflow server --host 0.0.0.0`).
EXPOSE 5000
# Runs every command as the owner of /workspace (see the script), the default one included:
# `accelbench doctor`, then `dvc repro` in the mounted checkout (or the image's copy).
ENTRYPOINT ["/opt/accelbench/docker/entrypoint.sh"]
CMD ["/opt/accelbench/docker/run-pipeline.sh"]

# The devcontainer: the same runtime plus the lock's dev group (pytest, ruff, hadolint, uv for
# `make lock`, ...) and shell comforts. VS Code connects as `dev` (uid changed to the host
# user's by its updateRemoteUserUID); the venv needs no writes, so any uid works.
FROM runtime AS dev
RUN apt-get update \
    && apt-get install -y --no-install-recommends make less sudo \
    && rm -rf /var/lib/apt/lists/* \
    && echo "dev ALL=(ALL) NOPASSWD:ALL" > /etc/sudoers.d/dev \
    && pip install --require-hashes --no-deps -r /opt/venv/dev-requirements.txt
