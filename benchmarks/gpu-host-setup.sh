# Sourced by the gpu-host-*.sh scripts: install the wheelhouse (make wheelhouse PY=3.12
# HOST_PACKAGES=tools/host-packages/nvidia-h200.txt) into /tmp/site on an air-gapped GPU host
# and put `accelbench` on the PATH. NVLink multicast stays
# off in NCCL, PyTorch and NVSHMEM (shared hosts: a multicast fault can take their GPUs down).
export PYTHONUNBUFFERED=1 MLFLOW_DISABLE_TELEMETRY=true
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# Byte-compiled at install (no --no-compile): without .pyc files, and with
# PYTHONDONTWRITEBYTECODE set, every stage process recompiled MLflow, SQLAlchemy, pandas, ...
# from source: about 6,000 compile() calls, 7-11 s per process on the H200 host.
python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD/src" PATH="/tmp/site/bin:$PATH"
# The stages call `accelbench`; without an installed entry point, a shim does.
printf '#!/bin/sh\nexec python3 -m accelbench.cli "$@"\n' > /tmp/site/bin/accelbench
chmod +x /tmp/site/bin/accelbench
[ -d .git ] || { git init -q && git add -A && git -c user.name=run -c user.email=run@localhost commit -qm run; }
