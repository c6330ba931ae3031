#!/usr/bin/env bash
# Base image hetfl-base:bookworm without any registry: a minimal Debian 12 root file system made by
# debootstrap (python3, python3-venv, ca-certificates) and loaded with `docker import`. docker/Dockerfile
# builds FROM it (docs/deployment.md, "Docker Compose").
#
# Usage (root, Debian/Ubuntu host with debootstrap and a running Docker engine):
#   bash docker/build-base.sh            # skips what exists: the cached tarball, the image
#   REBUILD=1 bash docker/build-base.sh  # debootstrap and import again
# Environment: DEBIAN_MIRROR (default http://deb.debian.org/debian), HETFL_BASE_IMAGE (default hetfl-base:bookworm),
# DOCKER (default: /usr/bin/docker when it exists, else docker).
# The root file system is cached as docker/.cache/debian-bookworm-minbase.tar (git- and docker-ignored).
set -euo pipefail
cd "$(dirname "$0")"
SUITE=bookworm   # Python 3.11, as the wheels pinned in pyproject.toml (cp311) need
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
IMAGE="${HETFL_BASE_IMAGE:-hetfl-base:$SUITE}"
DOCKER="${DOCKER:-$( [ -x /usr/bin/docker ] && echo /usr/bin/docker || echo docker )}"
CACHE=.cache
TAR="$CACHE/debian-$SUITE-minbase.tar"
say() { printf 'build-base [%4ss]: %s\n' "$SECONDS" "$*"; }

[ "$(id -u)" = 0 ] || { echo "build-base: error: run as root (debootstrap and docker need it)" >&2; exit 2; }
for _ in $(seq 30); do "$DOCKER" info >/dev/null 2>&1 && break; sleep 1; done   # a dockerd just started needs a moment
"$DOCKER" info >/dev/null 2>&1 || { echo "build-base: error: no Docker engine answers ('$DOCKER info' failed for 30 s); start dockerd first" >&2; exit 2; }

if [ "${REBUILD:-0}" != 1 ] && "$DOCKER" image inspect "$IMAGE" >/dev/null 2>&1; then
  say "image $IMAGE exists (REBUILD=1 to make it again)"
  exit 0
fi

mkdir -p "$CACHE"
if [ "${REBUILD:-0}" = 1 ] || [ ! -s "$TAR" ]; then
  command -v debootstrap >/dev/null || { echo "build-base: error: debootstrap missing; apt-get install debootstrap" >&2; exit 2; }
  root="$CACHE/rootfs.tmp"
  rm -rf "$root" "$TAR.tmp"
  say "debootstrap $SUITE (minbase + python3, python3-venv, ca-certificates) from $MIRROR into $root (about 1 min)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates "$SUITE" "$root" "$MIRROR" \
    > "$CACHE/debootstrap.log" 2>&1 || { echo "build-base: error: debootstrap failed; see docker/$CACHE/debootstrap.log" >&2; exit 1; }
  # What an image does not need: downloaded packages, package lists, docs; the host's resolver (Docker sets its own).
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
         "$root"/usr/share/man/* "$root"/usr/share/info/* "$root"/usr/share/locale/* "$root"/var/log/*.log
  : > "$root/etc/resolv.conf"
  echo "hetfl" > "$root/etc/hostname"
  tar --numeric-owner -C "$root" -cf "$TAR.tmp" .
  mv "$TAR.tmp" "$TAR"
  rm -rf "$root"
  say "root file system cached in docker/$TAR ($(du -h "$TAR" | cut -f1))"
else
  say "using the cached root file system docker/$TAR"
fi

say "docker import -> $IMAGE"
"$DOCKER" import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["/bin/bash"]' \
  "$TAR" "$IMAGE" >/dev/null
say "image $IMAGE ready ($("$DOCKER" image inspect -f '{{.Size}}' "$IMAGE" | awk '{printf "%.0f MB", $1/1e6}'))"
