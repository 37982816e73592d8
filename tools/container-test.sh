#!/usr/bin/env bash
# `make container-test`: build the Dockerfile's images and run the pipeline in them as a user
# would, on a machine with no Docker engine and no container registry (like CI's).
#
# - Debian's buildah, podman and runc (installed with apt when missing; needs root).
# - A minimal Debian made with debootstrap stands in for nvidia/cuda:*-base-ubuntu*: it carries
#   a user `ubuntu` at uid 1000 as Ubuntu's images do; `buildah build --from` substitutes it for
#   the first FROM without editing the Dockerfile. It is cached in $CACHE between runs.
# - Builds the `runtime` and `dev` targets; fails when the image is over $MAX_IMAGE_GB or more
#   than one layer carries the Python environment.
# - Runs `accelbench doctor` (CPU only: exit 3), then the default command on a fresh clone of
#   this repository owned by uid 4242 (not the image's 1000), with --user 4242:4242,
#   --network none, the MNIST mirror read-only and tiny params: it must write the report, leave
#   every file owned by 4242 and `git status` clean but for the run's own changes; then the same
#   checkout without --user (the entry point drops to its owner), a wrong --user (refused
#   clearly), the MLflow store read from the host, and the devcontainer (configuration read by
#   @devcontainers/cli, built by it, its post-create command run as a `dev` whose uid VS Code
#   changed to the host user's).
# Everything it creates (images, containers, storage, the clone) lives in a folder of its own
# under /var/tmp and is removed on exit, failed or not, so two runs on one machine do not touch
# each other's mounts; the base and the npm tool stay cached, built under a lock.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
# ACCELBENCH_CONTAINER_KEEP (for working on this script) keeps the layers between runs in one
# fixed folder; otherwise each run gets its own.
if [ -n "${ACCELBENCH_CONTAINER_WORK:-}" ]; then
  WORK=$ACCELBENCH_CONTAINER_WORK
elif [ -n "${ACCELBENCH_CONTAINER_KEEP:-}" ]; then
  WORK=/var/tmp/accelbench-container-test
else
  WORK=
fi
CACHE=${ACCELBENCH_CONTAINER_CACHE:-/var/cache/accelbench-container-test}
# The container runs with --network none: MNIST comes from a local mirror, by default the raw
# files an earlier `make repro` downloaded, else CI's verified copy beside the checkout.
if [ -z "${ACCELBENCH_MNIST_MIRROR:-}" ] && [ -f "$REPO/data/raw/train-images-idx3-ubyte.gz" ]; then
  MIRROR="$REPO/data/raw"
else
  MIRROR=${ACCELBENCH_MNIST_MIRROR:-$(cd "$REPO/.." && pwd)/shared/datasets/mnist}
fi
MAX_IMAGE_GB=${MAX_IMAGE_GB:-9}
SUITE=trixie
DEVCONTAINER_CLI=@devcontainers/cli@0.89.0
IMAGE=localhost/accelbench-test
BASE=localhost/accelbench-test-base:$SUITE
OWNER=4242
PYTHON=${PYTHON:-$REPO/.venv/bin/python}

passed=0
say() { printf 'container-test: %s\n' "$*"; }
ok() { passed=$((passed + 1)); say "ok: $*"; }
fail() {
  printf 'container-test: FAILED: %s\n' "$*" >&2
  printf 'container-test: %d passed, 1 failed\n' "$passed"
  exit 1
}
elapsed() { echo $(($(date +%s) - $1)); }

[ "$(id -u)" = 0 ] || fail "needs root (apt-get, debootstrap, rootful podman)"
[ -f "$MIRROR/train-images-idx3-ubyte.gz" ] \
  || fail "no MNIST at $MIRROR: run make repro first, or set ACCELBENCH_MNIST_MIRROR to a folder with the four .gz files"
[ -x "$PYTHON" ] || fail "no $PYTHON: run make setup first"

missing=()
for tool in buildah podman runc debootstrap setpriv; do
  command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing buildah podman runc debootstrap with apt"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    buildah podman runc debootstrap uidmap util-linux >/dev/null
fi

# --- storage and runtime settings that work in a sandbox without systemd or cgroup v2 -----
cleanup() {
  status=$?
  set +e
  if [ -n "${ACCELBENCH_CONTAINER_KEEP:-}" ]; then  # for working on this script: keep the layers
    say "kept $WORK (ACCELBENCH_CONTAINER_KEEP)"
    exit "$status"
  fi
  if [ -n "$own_storage" ]; then  # only this run's storage, never a caller's
    podman rm --all --force >/dev/null 2>&1
    buildah rm --all >/dev/null 2>&1
    podman rmi --all --force >/dev/null 2>&1
    podman system reset --force >/dev/null 2>&1
    umount -R "$WORK/storage" 2>/dev/null
  fi
  rm -rf "$WORK"
  [ "$status" = 0 ] || say "failed (exit $status); images, containers and $WORK removed"
  exit "$status"
}
if [ -z "$WORK" ]; then
  WORK=$(mktemp -d /var/tmp/accelbench-container-test.XXXXXX)
  chmod 755 "$WORK"  # mktemp's 700 would keep uid $OWNER out of its checkout inside
elif [ -z "${ACCELBENCH_CONTAINER_KEEP:-}" ] && [ -e "$WORK" ]; then
  fail "$WORK exists: another run may be using it; remove it or leave ACCELBENCH_CONTAINER_WORK unset"
fi
own_storage=
trap cleanup EXIT
trap 'exit 130' INT TERM
rm -rf "$WORK/checkout" "$WORK/owner-home"
mkdir -p "$WORK/storage" "$WORK/run" "$CACHE"
# The cache is shared by every run on this machine: whoever fills or refreshes it holds this.
exec {cache_lock}>"$CACHE/.lock"
lock_cache() {  # at most 30 min behind another run's debootstrap or npm install
  flock --nonblock "$cache_lock" && return
  say "waiting for $CACHE/.lock: another container test is filling the cache"
  flock --wait 1800 "$cache_lock" || fail "$CACHE/.lock still held after 30 min"
}
cat >"$WORK/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
cat >"$WORK/storage.conf" <<EOF
[storage]
driver = "overlay"
graphroot = "$WORK/storage"
runroot = "$WORK/run"
EOF
: >"$WORK/registries.conf"   # no registry is searched: only local images resolve
export CONTAINERS_CONF="$WORK/containers.conf" CONTAINERS_STORAGE_CONF="$WORK/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$WORK/registries.conf" BUILDAH_ISOLATION=chroot
export TMPDIR="$WORK/tmp"
mkdir -p "$TMPDIR"
own_storage=1

# --- the checkout: a fresh clone with tiny params, owned by another uid --------------------
checkout="$WORK/checkout"
git clone --quiet "$REPO" "$checkout"
"$PYTHON" - "$checkout/params.yaml" <<'EOF'
import sys, yaml
path = sys.argv[1]
params = yaml.safe_load(open(path))
params["train"].update(epochs=2, train_subset=1024, test_subset=512, eval_batch_size=512)
yaml.safe_dump(params, open(path, "w"), sort_keys=False)
EOF
(cd "$checkout" && PYTHONPATH="$checkout/src" "$PYTHON" -m accelbench.cli check >/dev/null) \
  || fail "the tiny params do not validate"
mkdir -p "$WORK/owner-home"
chown -R "$OWNER:$OWNER" "$checkout" "$WORK/owner-home"
# --- the stand-in base --------------------------------------------------------------------
rootfs="$CACHE/rootfs-$SUITE"
lock_cache
if [ ! -f "$rootfs/.complete" ]; then
  mirror=$(sed -n 's/^URIs: *\(http[^ ]*debian\)$/\1/p' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -n1)
  mirror=${mirror:-http://deb.debian.org/debian}
  say "making the base: debootstrap $SUITE from $mirror"
  started=$(date +%s)
  rm -rf "$rootfs"
  debootstrap --variant=minbase --include=ca-certificates "$SUITE" "$rootfs" "$mirror" >"$WORK/debootstrap.log" 2>&1 \
    || { tail -n 20 "$WORK/debootstrap.log"; fail "debootstrap"; }
  chroot "$rootfs" useradd --create-home --uid 1000 --shell /bin/bash ubuntu   # as in ubuntu:24.04
  rm -rf "$rootfs/var/cache/apt/archives/"*.deb
  touch "$rootfs/.complete"
  say "base made in $(elapsed "$started") s"
fi
# HTTPS from inside the build goes through this machine's TLS set-up: trust its extra CAs
# (at test time only; the image itself is built as the Dockerfile says).
rm -f "$rootfs/usr/local/share/ca-certificates/"*.crt
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
fi
TMPDIR=/tmp chroot "$rootfs" /usr/sbin/update-ca-certificates --fresh >/dev/null 2>&1
if [ -z "${ACCELBENCH_CONTAINER_KEEP:-}" ] || ! podman image exists "$BASE"; then
  tar -C "$rootfs" --numeric-owner --exclude=./.complete -c . \
    | podman import --quiet \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE" >/dev/null
fi
flock --unlock "$cache_lock"
# What `devcontainer build` asks for by name, as the Dockerfile's FROM does.
cuda=$(sed -n 's/^ARG CUDA_VERSION=//p' "$REPO/Dockerfile")
ubuntu=$(sed -n 's/^ARG UBUNTU=//p' "$REPO/Dockerfile")
podman tag "$BASE" "docker.io/nvidia/cuda:${cuda}-base-ubuntu${ubuntu}"

# --- build ----------------------------------------------------------------------------------
build() {  # target
  buildah build --quiet --pull=never --layers --from "$BASE" --target "$1" -t "$IMAGE:$1" "$REPO" \
    >"$WORK/build-$1.log" 2>&1 || { tail -n 40 "$WORK/build-$1.log"; fail "buildah build --target $1"; }
}
started=$(date +%s)
build runtime
build_runtime_s=$(elapsed "$started")
started=$(date +%s)
build dev
build_dev_s=$(elapsed "$started")
size=$(podman image inspect --format '{{.Size}}' "$IMAGE:runtime")
size_gb=$(awk -v b="$size" 'BEGIN { printf "%.2f", b / 1e9 }')
say "built runtime in $build_runtime_s s, dev in $build_dev_s s; runtime image $size_gb GB"
podman history --format '{{.Size}}\t{{.CreatedBy}}' "$IMAGE:runtime" | cut -c1-150 >"$WORK/layers.txt"
awk -v max="$MAX_IMAGE_GB" -v b="$size" 'BEGIN { exit !(b / 1e9 <= max) }' \
  || { cat "$WORK/layers.txt"; fail "the image is $size_gb GB, over $MAX_IMAGE_GB GB"; }
ok "image $size_gb GB (at most $MAX_IMAGE_GB GB)"
big_layers=$(podman history --format '{{.Size}}' "$IMAGE:runtime" | awk '$2 == "GB" && $1 >= 1' | wc -l)
[ "$big_layers" = 1 ] \
  || { cat "$WORK/layers.txt"; fail "$big_layers layers over 1 GB: the Python environment is written more than once"; }
ok "one layer over 1 GB (the Python environment)"

run() { podman run --rm --network none "$@"; }

# --- accelbench doctor: CPU only --------------------------------------------------------------
status=0
run "$IMAGE:runtime" accelbench doctor >"$WORK/doctor.log" 2>&1 || status=$?
[ "$status" = 3 ] || { cat "$WORK/doctor.log"; fail "accelbench doctor exited $status, expected 3 (CPU only)"; }
ok "accelbench doctor in the image: CPU only (exit 3)"

# --- the default command on that checkout ------------------------------------------------------
as_owner() { setpriv --reuid="$OWNER" --regid="$OWNER" --clear-groups env HOME="$WORK/owner-home" "$@"; }
mounts=(-v "$checkout:/workspace" -v "$MIRROR:/mnist:ro" -e ACCELBENCH_MNIST_MIRROR=/mnist)

started=$(date +%s)
run --user "$OWNER:$OWNER" "${mounts[@]}" "$IMAGE:runtime" >"$WORK/pipeline.log" 2>&1 \
  || { tail -n 60 "$WORK/pipeline.log"; fail "the default command (dvc repro) as --user $OWNER:$OWNER"; }
pipeline_s=$(elapsed "$started")
say "dvc repro in the image as --user $OWNER:$OWNER: $pipeline_s s"
[ -s "$checkout/reports/comparison.md" ] || fail "no reports/comparison.md"
grep -q "skipped" "$checkout/reports/comparison.md" || fail "the report does not show the skipped CUDA variants"
strangers=$(find "$checkout" ! -uid "$OWNER" -print | head -n 5)
[ -z "$strangers" ] || fail "files not owned by uid $OWNER: $strangers"
changes=$(as_owner git -C "$checkout" status --porcelain) \
  || fail "git status on the host refuses the checkout"
# what a user commits after a run (docs/comparing-with-dvc.md): dvc.lock and compare's
# git-tracked figures under reports/, both rewritten over the committed run of record's (the
# rest of reports/ stays ignored)
stray=$(printf '%s\n' "$changes" | grep -vE '^ M (params\.yaml|dvc\.lock|reports/(metrics|plots)/.+)$' || true)
[ -z "$stray" ] && printf '%s\n' "$changes" | grep -qx ' M dvc.lock' \
  && printf '%s\n' "$changes" | grep -qx ' M reports/metrics/cpu.json' \
  || fail "git status shows more than params.yaml, dvc.lock and reports/, or not those: $changes"
ok "the report written, every file owned by uid $OWNER, git status on the host: params.yaml, dvc.lock"

# Without --user: the entry point runs the command as the checkout's owner.
who=$(run "${mounts[@]}" "$IMAGE:runtime" sh -c 'id -u; touch /workspace/.probe')
[ "$who" = "$OWNER" ] || fail "without --user the command ran as uid $who, not the owner $OWNER"
[ "$(stat -c %u "$checkout/.probe")" = "$OWNER" ] || fail "without --user a file was written as $(stat -c %u "$checkout/.probe")"
rm -f "$checkout/.probe"
run "${mounts[@]}" "$IMAGE:runtime" dvc status >"$WORK/dvc-status.log" 2>&1 \
  || { cat "$WORK/dvc-status.log"; fail "dvc status without --user"; }
grep -q "train@cpu" "$WORK/dvc-status.log" && { cat "$WORK/dvc-status.log"; fail "dvc status in the image wants to re-train"; }
ok "without --user: ran as the owner $OWNER, dvc status up to date"

# A --user that cannot write the checkout is refused before any work, saying what to do.
status=0
run --user 5555:5555 "${mounts[@]}" "$IMAGE:runtime" >"$WORK/wrong-user.log" 2>&1 || status=$?
[ "$status" = 1 ] && grep -q 'belongs to uid 4242' "$WORK/wrong-user.log" \
  || { cat "$WORK/wrong-user.log"; fail "a wrong --user was not refused clearly (exit $status)"; }
ok "a --user that cannot write the checkout is refused, naming its owner"

# The MLflow store the container wrote, read on the host at another path.
# (as root: the host's venv may live where uid 4242 cannot read)
(cd "$checkout" && PYTHONPATH="$checkout/src" "$PYTHON" -m accelbench.cli runs >"$WORK/runs.log" 2>&1) \
  || { cat "$WORK/runs.log"; fail "accelbench runs on the host over the container's store"; }
(cd "$checkout" && PYTHONPATH="$checkout/src" "$PYTHON" - <<'EOF'
import mlflow
from mlflow.tracking import MlflowClient
from accelbench.report.runs import pipeline_summary
from accelbench.system.tracking.store import tracking_uri
from pathlib import Path
mlflow.set_tracking_uri(tracking_uri(Path(".")))
parent, children = pipeline_summary(Path("."))
assert parent is not None and parent.info.status == "FINISHED", parent
names = {a.path for a in MlflowClient().list_artifacts(parent.info.run_id)}
assert "comparison.md" in names, names
local = MlflowClient().download_artifacts(parent.info.run_id, "comparison.md")
assert "skipped" in open(local).read()
print(f"host: pipeline run {parent.info.run_id} and {len(children)} variant runs read back")
EOF
) >"$WORK/store.log" 2>&1 || { cat "$WORK/store.log"; fail "the container's MLflow store is not readable on the host"; }
ok "$(tail -n1 "$WORK/store.log")"

# --- the devcontainer ---------------------------------------------------------------------
npm_prefix="$CACHE/npm"
lock_cache
if [ ! -x "$npm_prefix/bin/devcontainer" ]; then
  npm install --silent --prefix "$npm_prefix" --global "$DEVCONTAINER_CLI" >/dev/null
fi
flock --unlock "$cache_lock"
devcontainer="$npm_prefix/bin/devcontainer"
# From this repository, as the images above were built: the build then reuses their layers.
"$devcontainer" read-configuration --workspace-folder "$REPO" --docker-path podman \
  >"$WORK/devcontainer.json" 2>"$WORK/devcontainer.log" \
  || { cat "$WORK/devcontainer.log"; fail "devcontainer read-configuration"; }
post_create=$("$PYTHON" - "$WORK/devcontainer.json" <<'EOF'
import json, sys
config = json.load(open(sys.argv[1]))["configuration"]
assert config["build"]["target"] == "dev" and config["remoteUser"] == "dev", config
assert config["workspaceFolder"] == "/workspace", config["workspaceFolder"]
print(config["postCreateCommand"])
EOF
) || fail "devcontainer.json as the reference implementation reads it: $post_create"
started=$(date +%s)
"$devcontainer" build --workspace-folder "$REPO" --docker-path podman --image-name "$IMAGE:devcontainer" \
  --log-level info >"$WORK/devcontainer-build.log" 2>&1 \
  || { tail -n 40 "$WORK/devcontainer-build.log"; fail "devcontainer build"; }
ok "devcontainer read-configuration and build (podman): $(elapsed "$started") s"
# VS Code's updateRemoteUserUID gives `dev` the host user's uid; then the post-create command
# runs as that user in the checkout: the checkout's code must be what runs.
status=0
run --user 0 -v "$checkout:/workspace" -e ACCELBENCH_STAY_ROOT=1 --entrypoint bash "$IMAGE:devcontainer" -c "
  usermod --uid $OWNER dev && groupmod --gid $OWNER dev && chown -R $OWNER:$OWNER /home/dev
  cd /workspace && exec setpriv --reuid=$OWNER --regid=$OWNER --init-groups env HOME=/home/dev USER=dev bash -c '
    set -e
    $post_create
    make lint'
" >"$WORK/post-create.log" 2>&1 || status=$?
[ "$status" = 0 ] || { cat "$WORK/post-create.log"; fail "the devcontainer's post-create command as dev with uid $OWNER (exit $status)"; }
grep -q "accelbench from /workspace/src/" "$WORK/post-create.log" || { cat "$WORK/post-create.log"; fail "post-create did not import the checkout's code"; }
grep -q "post-create: CPU only" "$WORK/post-create.log" || { cat "$WORK/post-create.log"; fail "post-create did not say the container is CPU only"; }
ok "devcontainer: post-create command and make lint ran as dev with uid $OWNER on the checkout's code"

# A GPU asked for (ACCELBENCH_GPU=1) that never arrived fails post-create with the fix; `make
# lock` and `make wheelhouse` run the image's own environment's tools.
status=0
run -v "$checkout:/workspace" -e ACCELBENCH_GPU=1 --entrypoint bash "$IMAGE:devcontainer" -c "
  cd /workspace && $post_create" >"$WORK/post-create-gpu.log" 2>&1 || status=$?
[ "$status" = 1 ] && grep -q "nvidia.com/gpu=all" "$WORK/post-create-gpu.log" \
  || { cat "$WORK/post-create-gpu.log"; fail "post-create with ACCELBENCH_GPU=1 and no GPU (exit $status)"; }
run -v "$checkout:/workspace" --entrypoint bash "$IMAGE:devcontainer" -c "
  cd /workspace && make -n lock && make -n wheelhouse PY=3.12 HOST_PACKAGES=tools/host-packages/nvidia-h200.txt" \
  >"$WORK/make-n.log" 2>&1 || { cat "$WORK/make-n.log"; fail "make -n lock / wheelhouse in the devcontainer"; }
grep -qx '"/opt/venv/bin/uv" lock' "$WORK/make-n.log" && grep -q '^"/opt/venv/bin/python" tools/wheelhouse.py' "$WORK/make-n.log" \
  && ! grep -q -- "-m venv" "$WORK/make-n.log" || { cat "$WORK/make-n.log"; fail "make lock / wheelhouse do not use /opt/venv"; }
ok "devcontainer: a missing GPU that was asked for fails post-create with the fix; make lock and wheelhouse use /opt/venv"

say "build runtime ${build_runtime_s} s + dev ${build_dev_s} s, image ${size_gb} GB, pipeline ${pipeline_s} s"
printf 'container-test: %d passed, 0 failed\n' "$passed"
