#!/usr/bin/env bash
# The image's entry point: runs the command as the owner of the checkout mounted at
# /workspace, whatever their uid, so every file it writes belongs to the host user and git on
# the host keeps trusting the repository.
#
#   started as root (plain `docker run`): drops to the uid:gid that owns /workspace (to the
#     image's user `dev`, uid 1000, when no checkout is mounted; stays root only when the
#     checkout is root's, e.g. under rootless Podman, where root is the host user);
#   started as another user (`--user "$(id -u):$(id -g)"`): runs as that user, and stops with
#     a clear message when that user cannot write the checkout.
# Either way HOME, USER and the caches point somewhere that user can write.
set -euo pipefail
WORKSPACE=/workspace

if [ "$(id -u)" = 0 ] && [ -z "${ACCELBENCH_STAY_ROOT:-}" ]; then
  owner=$(stat -c %u:%g "$WORKSPACE")
  if [ "$owner" = 0:0 ] && [ ! -e "$WORKSPACE/dvc.yaml" ]; then
    owner=1000:1000   # nothing mounted: the image's own user
  fi
  if [ "${owner%%:*}" != 0 ]; then
    exec setpriv --reuid="${owner%%:*}" --regid="${owner##*:}" --clear-groups -- "$0" "$@"
  fi
fi

uid=$(id -u)
if [ -e "$WORKSPACE/dvc.yaml" ] && [ ! -w "$WORKSPACE" ]; then
  echo "accelbench: the checkout at $WORKSPACE belongs to uid $(stat -c %u "$WORKSPACE"), but this" \
    "container runs as uid $uid, which cannot write it. Run it as the checkout's owner:" \
    "docker run --user \"\$(id -u):\$(id -g)\" ... (or leave out --user)." >&2
  exit 1
fi

# A uid without an entry in /etc/passwd (Docker's --user) has no name and no home, and Podman
# makes the working directory its home: give it both, never inside the checkout, so getpass
# (torch.compile's cache), git, DVC and matplotlib work and leave the checkout clean.
if ! name=$(id -un 2>/dev/null); then
  name="uid$uid"
fi
export USER="$name" LOGNAME="$name"
home=$(getent passwd "$uid" | cut -d: -f6 || true)
case "$home" in
  "" | / | "$WORKSPACE" | "$WORKSPACE"/*) home="/tmp/home-$uid" ;;
esac
mkdir -p "$home" 2>/dev/null || true
if [ ! -w "$home" ]; then
  home="/tmp/home-$uid"
  mkdir -p "$home"
fi
export HOME="$home"
exec "$@"
