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
ARG BASE=localhost/scaletrain-base:bookworm
FROM ${BASE}
ARG TORCH=torch==2.13.0
ARG PIP_EXTRA_INDEX=
ARG OFFLINE=
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
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
WORKDIR /runs
CMD ["scaletrain", "--help"]
