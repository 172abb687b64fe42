#!/usr/bin/env bash
# Build scaletrain's CPU container image without pulling anything: a Debian bookworm root filesystem
# made with mmdebstrap from the package mirror (minbase + python3 + venv + Fashion-MNIST), imported
# into podman as the base, then the Dockerfile's steps with every wheel collected here beforehand
# (the torch CPU wheel comes from the local disk, as scripts/setup.sh gets it).
#
#   scripts/build-image.sh [TAG]        # default scaletrain:cpu; prints the image size and build time
#   ENGINES=tensorflow,mxnet scripts/build-image.sh scaletrain:engines
#                                       # also the foreign engines' environments in /opt/engines (their
#                                       # pinned wheels collected here too), for deploy kubernetes --framework
#
# Needs root, podman, runc and mmdebstrap (apt-get install podman runc mmdebstrap).
#
# What changes rarely is built once and kept in podman's store, each under a tag keyed by a hash of
# what makes it, so a later build (another clone or CI run on this machine) starts from it and a
# changed recipe gets a new tag instead of a stale image:
#   localhost/scaletrain-base:bookworm-KEY   the root filesystem (key: suite, variant, packages); also
#                                            tagged localhost/scaletrain-base:bookworm, the Dockerfile's
#                                            default BASE
#   localhost/scaletrain-deps:KEY            the base plus /opt/venv with torch and the package's
#                                            dependencies (key: base image, torch pin, dependencies, recipe)
# The Dockerfile then builds on the second: its torch and dependencies are already satisfied, so the
# build copies and installs only the package. When a build on kept images fails (an image damaged in
# the store), they are remade and the build tried once more. SCALETRAIN_REBUILD_BASE=1 remakes both.
set -euo pipefail
cd "$(dirname "$0")/.."
tag=${1:-scaletrain:cpu}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
variant=minbase
packages=python3,python3-venv,ca-certificates,dataset-fashion-mnist
torch_pin=torch==2.13.0
# On this kernel podman needs runc, cgroupfs and explicit limits (the defaults fail to apply).
podman=(podman --runtime runc --cgroup-manager=cgroupfs)
limits=(--ulimit nofile=1024:1024 --ulimit nproc=4096:4096)
work=build/image
started=$(date +%s)
engines=${ENGINES:-}  # comma-separated: the Dockerfile's ENGINES build argument

for tool in podman runc mmdebstrap; do
    command -v "$tool" >/dev/null || { echo "build-image: $tool is missing; as root: apt-get install -y podman runc mmdebstrap" >&2; exit 2; }
done
[ -x .venv/bin/pip ] || { echo "build-image: run scripts/setup.sh first (the wheels are collected with .venv's pip)" >&2; exit 2; }
# Each engine's pinned packages, as `scaletrain engines install` installs them (one line per engine).
engine_packages=
if [ -n "$engines" ]; then
    engine_packages=$(PYTHONPATH=src .venv/bin/python -c '
import sys
from scaletrain.engines.registry import ENGINES
known = ", ".join(ENGINES)
for name in sys.argv[1].split(","):
    if name not in ENGINES:
        sys.exit(f"build-image: ENGINES names {name!r}; the engines are {known}")
    print(" ".join(ENGINES[name].packages))
' "$engines") || exit 2
fi
mkdir -p "$work"
trap 'rm -rf "$work/wheels" "$work/rootfs.tar"' EXIT  # hundreds of MB, also when a step fails

key() { sha256sum | cut -c1-16; }
quiet_pip_download() {
    .venv/bin/pip download --quiet --disable-pip-version-check --dest "$work/wheels" "$@" \
        2> >(grep -v "^WARNING: Location" >&2)
}
# The functions below run where `set -e` does not stop them (after `||`), hence each `|| return`.

base=localhost/scaletrain-base:$suite-$(printf '%s\n' "$suite" "$variant" "$packages" | key)
make_base() {
    echo "build-image: base root filesystem from $mirror (mmdebstrap)"
    mmdebstrap --quiet --variant="$variant" --include="$packages" "$suite" "$work/rootfs.tar" "$mirror" || return
    "${podman[@]}" import --quiet --change 'CMD ["/bin/bash"]' "$work/rootfs.tar" "$base" >/dev/null || return
    rm -f "$work/rootfs.tar"
    "${podman[@]}" tag "$base" "localhost/scaletrain-base:$suite"
}

# The package's runtime dependencies as pyproject.toml lists them (torch among them, as a floor).
requirements=$(.venv/bin/python -c \
    'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))')
# The Dockerfile's install without the package itself: torch pinned first, then the dependencies.
deps_recipe="FROM $base
RUN --mount=type=bind,source=$work/wheels,target=/wheels \\
    set -e; python3 -m venv /opt/venv; \\
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --find-links /wheels '$torch_pin'; \\
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index --find-links /wheels -r /wheels/requirements.txt; \\
    /opt/venv/bin/python -c 'import torch, numpy'"
# The deps image's name for the base as it is now.
name_deps() {
    deps=localhost/scaletrain-deps:$({ "${podman[@]}" image inspect --format '{{.Id}}' "$base" &&
        printf '%s\n' "$requirements" "$deps_recipe"; } | key)
}
make_deps() {
    name_deps || return
    echo "build-image: $torch_pin and the package's dependencies into /opt/venv on the base"
    rm -rf "$work/wheels"
    quiet_pip_download "$torch_pin" "setuptools>=68" . || return
    printf '%s\n' "$requirements" >"$work/wheels/requirements.txt"
    # --no-cache: podman's layer cache would match the RUN line alone, not the requirements it installs.
    "${podman[@]}" build --quiet --no-cache --pull=never --network none "${limits[@]}" --tag "$deps" --file - . \
        <<<"$deps_recipe" >/dev/null || return
    # Deps images of other keys (another torch, base or dependency list) are not used any more; one that a
    # build or container still uses stays.
    "${podman[@]}" images --format '{{.Repository}}:{{.Tag}}' localhost/scaletrain-deps | grep -vxF "$deps" |
        xargs -r "${podman[@]}" rmi >/dev/null 2>&1 || true
}
find_deps() { name_deps && "${podman[@]}" image exists "$deps"; }

final() {
    echo "build-image: podman build $tag"
    previous=$("${podman[@]}" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
    if [ ! -f "$work/wheels/requirements.txt" ]; then
        # Torch and the dependencies are in the deps image; building the package needs only its build backend.
        rm -rf "$work/wheels"
        quiet_pip_download "setuptools>=68" || return
    fi
    # One download per engine: their pins clash (MXNet needs numpy<1.24), so each resolves on its own.
    while read -r pins; do
        [ -z "$pins" ] || { echo "build-image: engine wheels $pins"; quiet_pip_download $pins || return; }
    done <<<"$engine_packages"
    "${podman[@]}" build --quiet --pull=never --network none "${limits[@]}" \
        --build-arg BASE="$deps" --build-arg OFFLINE=1 --build-arg ENGINES="$engines" --tag "$tag" . >/dev/null
}

kept=1  # whether the build starts from images made by an earlier build
if [ -n "${SCALETRAIN_REBUILD_BASE:-}" ] || ! "${podman[@]}" image exists "$base"; then
    make_base || exit 1
    kept=
fi
find_deps || { make_deps || exit 1; kept=; }
if ! final; then
    [ -n "$kept" ] || exit 1  # made just now: the Dockerfile or the package failed
    echo "build-image: the build failed on the kept images; remaking them and building once more" >&2
    make_deps || { make_base && make_deps; } || exit 1
    final
fi
current=$("${podman[@]}" image inspect --format '{{.Id}}' "$tag")
if [ -n "$previous" ] && [ "$previous" != "$current" ]; then
    "${podman[@]}" rmi "$previous" >/dev/null 2>&1 || true  # the image this tag named before, now untagged
fi

size=$("${podman[@]}" image inspect --format '{{.Size}}' "$tag")
echo "build-image: $tag built in $(( $(date +%s) - started )) s, $(( size / 1000000 )) MB"
