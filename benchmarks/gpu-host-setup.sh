# Sourced by the gpu-host-*.sh scripts: install the wheelhouse (make wheelhouse PY=3.12
# HOST_PACKAGES=tools/host-packages/nvidia-h200.txt) into /tmp/site on an air-gapped GPU host
# and put `accelbench` on the PATH. NVLink multicast stays
# off in NCCL, PyTorch and NVSHMEM (shared hosts: a multicast fault can take their GPUs down).
# The host's facts a results page names (GPU, driver, clocks; Python, torch, CUDA, cuDNN), on
# stdout: the one-GPU scripts write them to $OUT/env.txt (gpu-host-scaling.sh writes its own,
# with the GPUs' links).
host_facts() {
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,utilization.gpu \
    --format=csv 2>&1
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())" 2>&1
}
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
# The host's own packages (torch, sympy, numpy, ...) came without bytecode and the image sets
# PYTHONDONTWRITEBYTECODE: every stage compiled them from source again (4,017 compile()
# calls, 7.6 s of a profiled train stage; docs/results/2026-12-03-h200-stage-anatomy.md).
# A user's install has bytecode (pip and the Dockerfile compile it), so the host's get the
# same, once, before anything is timed: the packages a stage and torch.compile import.
compiling=$(date +%s)
python3 -m compileall -q -j 0 $(python3 - <<'EOF'
import sys, sysconfig
import accelbench.cli, accelbench.training.loop, mlflow, torch._dynamo, torch._inductor.compile_fx
host = sysconfig.get_paths()["purelib"] + "/"
print(*sorted({host + m.__file__.removeprefix(host).split("/")[0] for m in list(sys.modules.values())
               if (getattr(m, "__file__", None) or "").startswith(host)}))
EOF
) > /dev/null
echo "bytecode for the host's packages: $(( $(date +%s) - compiling )) s"
