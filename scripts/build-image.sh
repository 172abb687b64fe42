#!/usr/bin/env bash
# Build scaletrain's CPU container image without pulling anything: a Debian bookworm root filesystem
# made with mmdebstrap from the package mirror (minbase + python3 + venv + Fashion-MNIST), imported
# into podman as the base, then the Dockerfile's steps with every wheel collected here beforehand
# (the torch CPU wheel comes from the local disk, as scripts/setup.sh gets it).
#
#   scripts/build-image.sh [TAG]        # default scaletrain:cpu; prints the image size and build time
#
# Needs root, podman, runc and mmdebstrap (apt-get install podman runc mmdebstrap). The base image is
# built once and kept (localhost/scaletrain-base:bookworm); SCALETRAIN_REBUILD_BASE=1 remakes it.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-scaletrain:cpu}
base=localhost/scaletrain-base:bookworm
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
# On this kernel podman needs runc, cgroupfs and explicit limits (the defaults fail to apply).
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
work=build/image
started=$(date +%s)

for tool in podman runc mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool is missing; as root: apt-get install -y podman runc mmdebstrap" >&2; exit 2; }
done
[ -x .venv/bin/pip ] || { echo "build-image: run scripts/setup.sh first (the wheels are collected with .venv's pip)" >&2; exit 2; }
mkdir -p "$work"
trap 'rm -rf "$work/wheels" "$work/rootfs.tar"' EXIT  # hundreds of MB, also when a step fails

if [ -n "${SCALETRAIN_REBUILD_BASE:-}" ] || ! "${podman[@]}" image exists "$base"; then
    echo "build-image: base root filesystem from $mirror (mmdebstrap)"
    mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,ca-certificates,dataset-fashion-mnist \
        bookworm "$work/rootfs.tar" "$mirror"
    "${podman[@]}" import --quiet --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base" >/dev/null
fi

echo "build-image: wheels for torch==2.13.0 and the package's dependencies"
rm -rf "$work/wheels"
.venv/bin/pip download --quiet --disable-pip-version-check --dest "$work/wheels" torch==2.13.0 "setuptools>=68" . \
    2> >(grep -v "^WARNING: Location" >&2)

echo "build-image: podman build $tag"
previous=$("${podman[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
"${podman[@]}" build --quiet --pull=never --network none "${limits[@]}" \
    --build-arg BASE="$base" --build-arg OFFLINE=1 --tag "$tag" . >/dev/null
current=$("${podman[@]}" image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    "${podman[@]}" rmi "$previous" >/dev/null 2>&1 || true  # the image this tag named before, now untagged
fi

size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")
echo "build-image: $tag built in $(( $(date +%s) - started )) s, $(( size / 1000000 )) MB"
