# scaletrain's container image: the package in a virtual environment, torch pinned and installed first
# as scripts/setup.sh does (a runtime image: no test tools, the package not editable).
#
#   scripts/build-image.sh                     # CPU image built offline from a Debian root filesystem
#   docker build --build-arg BASE=nvidia/cuda:12.8.1-runtime-ubuntu24.04 \
#       --build-arg TORCH="torch==2.13.0" --build-arg PIP_EXTRA_INDEX=https://download.pytorch.org/whl/cu128 .
#
# BASE needs python3 (3.11 or newer) with venv. build/image/wheels/ may hold wheels to install from
# (the build script fills it, with the CPU torch wheel from the local disk); OFFLINE=1 installs from
# it alone, so the build fetches nothing.
#
# ENGINES (e.g. --build-arg ENGINES=tensorflow,mxnet; scripts/build-image.sh takes ENGINES=… too) adds the
# foreign engines that `scaletrain deploy kubernetes --framework` runs: each installed by `scaletrain engines
# install NAME` (a venv of its own with the pinned packages) into SCALETRAIN_ENGINES=/opt/engines, where the
# pods' start scripts look; pip reads the wheels in /wheels and OFFLINE as above (through PIP_* variables).
ARG BASE=localhost/scaletrain-base:bookworm
FROM ${BASE}
ARG TORCH=torch==2.13.0
ARG PIP_EXTRA_INDEX=
ARG OFFLINE=
ARG ENGINES=
COPY pyproject.toml README.md /opt/scaletrain/
COPY src/ /opt/scaletrain/src/
RUN --mount=type=bind,source=build/image/wheels,target=/wheels \
    set -e; \
    if [ -n "$OFFLINE" ]; then set -- --no-index; fi; \
    if [ -n "$PIP_EXTRA_INDEX" ]; then set -- "$@" --extra-index-url "$PIP_EXTRA_INDEX"; fi; \
    python3 -m venv /opt/venv; \
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check "$@" --find-links /wheels "$TORCH"; \
    /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check "$@" --find-links /wheels /opt/scaletrain; \
    /opt/venv/bin/python -c "import scaletrain.cli, torch"
RUN --mount=type=bind,source=build/image/wheels,target=/wheels \
    set -e; \
    if [ -n "$ENGINES" ]; then \
        export PIP_FIND_LINKS=/wheels PIP_NO_CACHE_DIR=1 SCALETRAIN_ENGINES=/opt/engines; \
        if [ -n "$OFFLINE" ]; then export PIP_NO_INDEX=1; fi; \
        /opt/venv/bin/scaletrain engines install $(echo "$ENGINES" | tr ',' ' '); \
    fi
ENV PATH=/opt/venv/bin:$PATH \
    SCALETRAIN_ENGINES=/opt/engines \
    PYTHONUNBUFFERED=1
WORKDIR /runs
CMD ["scaletrain", "--help"]
