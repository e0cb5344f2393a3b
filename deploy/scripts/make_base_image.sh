#!/usr/bin/env bash
# A Python 3.11 base image built from Debian packages alone, for machines that can reach a
# Debian mirror and the Python package registry but no container registry (so
# `FROM python:3.11-slim` cannot be pulled). deploy/Dockerfile builds on it with
#   --build-arg BASE_IMAGE=fedgraph-base:bookworm
#
#   sudo deploy/scripts/make_base_image.sh [IMAGE] [MIRROR]
#
# debootstrap (minbase) of Debian bookworm, whose python3 is 3.11, plus a virtual
# environment in /opt/venv first on PATH, so `python` and `pip` behave as in the
# official image (Debian's own python3 refuses `pip install`, PEP 668). The root file
# system is imported with `docker import` or `podman import` (whichever is here;
# CONTAINER_ENGINE=podman picks). Needs root and about 400 MB in $TMPDIR; installs
# debootstrap with apt-get where it is missing.
set -euo pipefail
IMAGE="${1:-fedgraph-base:bookworm}"
MIRROR="${2:-http://deb.debian.org/debian}"
ENGINE="${CONTAINER_ENGINE:-$(command -v docker >/dev/null && echo docker || echo podman)}"

[ "$(id -u)" = 0 ] || { echo "make_base_image.sh: error: needs root (debootstrap, chroot)" >&2; exit 1; }
if ! command -v debootstrap >/dev/null && command -v apt-get >/dev/null; then
  echo "make_base_image.sh: installing debootstrap (apt-get)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1 \
    || { apt-get update -q >/dev/null 2>&1 \
         && DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null 2>&1; } || true
fi
command -v debootstrap >/dev/null \
  || { echo "make_base_image.sh: error: debootstrap not found and apt-get could not install it" >&2; exit 1; }
command -v "$ENGINE" >/dev/null \
  || { echo "make_base_image.sh: error: neither docker nor podman found" >&2; exit 1; }

ROOTFS="$(mktemp -d "${TMPDIR:-/tmp}/fedgraph-rootfs.XXXXXX")"
trap 'rm -rf "$ROOTFS"' EXIT
echo "make_base_image.sh: debootstrap bookworm from $MIRROR into $ROOTFS"
debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
  bookworm "$ROOTFS" "$MIRROR" >"$ROOTFS.log" 2>&1 \
  || { tail -20 "$ROOTFS.log" >&2; echo "make_base_image.sh: error: debootstrap failed (log $ROOTFS.log)" >&2; exit 1; }
rm -f "$ROOTFS.log"
chroot "$ROOTFS" python3 -m venv /opt/venv
# Certificate authorities this host added (a TLS-inspecting proxy's, for one): without them
# pip inside the build cannot reach the package registry. Public certificates only.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  cp /usr/local/share/ca-certificates/*.crt "$ROOTFS/usr/local/share/ca-certificates/"
  chroot "$ROOTFS" update-ca-certificates >/dev/null
  echo "make_base_image.sh: trusts this host's added CAs: $(cd /usr/local/share/ca-certificates && echo *.crt)"
fi
# What an image need not carry: package lists, caches, docs.
rm -rf "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/var/cache/apt/*.bin "$ROOTFS"/usr/share/doc/* \
  "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*

echo "make_base_image.sh: $ENGINE import -> $IMAGE"
tar -C "$ROOTFS" -c . | "$ENGINE" import \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'ENV SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python"]' \
  - "$IMAGE"
"$ENGINE" run --rm "$IMAGE" python -m pip --version
