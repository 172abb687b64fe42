"""Worker processes forked from a process that has imported torch and scaletrain once.

A fresh ``python -m scaletrain.parallel.worker`` spends about 2.5 CPU-seconds before its first step:
importing torch, then ``torch._dynamo`` (which every ``torch.optim`` optimizer imports when it is made),
then scaletrain. The local launcher pays that once per launching process instead: it starts Python's
``forkserver`` (:mod:`multiprocessing`) with those modules preloaded, and each rank is a fork of it.
The forked process is set up as the ``python -m`` one would be: the rank's environment, the
launcher's working folder, ``PYTHONPATH`` and the working folder at the front of ``sys.path``, its
output on the files given, death with the launcher (``PR_SET_PDEATHSIG`` on the fork server, which
exits with the launcher), and the same exit codes.

The launcher falls back to ``python -m`` where a fork would not be the same process:
``SCALETRAIN_WORKER_START=exec``, a process that must start in another network namespace, a launcher
whose environment changed since the fork server started in a variable read when torch or Python
starts (``PYTHON*``, ``LD_*``, ``OMP_*``, thread and allocator settings), a launcher run from a
script file (multiprocessing would import the user's script again in each process), and a launcher
that is itself a daemonic :mod:`multiprocessing` process (which may not have children).
"""

from __future__ import annotations

import ctypes
import functools
import importlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import sysconfig
from multiprocessing import reduction
from pathlib import Path
from typing import IO

__all__ = ["ENV_WORKER_START", "PreloadedProcess", "can_fork", "start_forked"]

#: ``exec`` makes the launcher start every process with ``python -m`` (the behaviour before forking).
ENV_WORKER_START = "SCALETRAIN_WORKER_START"
#: What the fork server imports before it forks anyone (``torch._dynamo``: every optimizer imports it).
PRELOAD = ["torch", "torch._dynamo", "scaletrain.parallel.worker"]
#: Environment variables read when Python, glibc, OpenMP or torch start: a change needs a fresh process.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "TORCH", "PYTORCH", "CUDA")

_server_environment: dict[str, str] | None = None  # the startup variables the fork server began with


def can_fork(environment: dict[str, str]) -> bool:
    """Whether a process with ``environment`` may be a fork of this launcher's preloaded server."""
    if environment.get(ENV_WORKER_START, "fork") == "exec" or not _main_is_safe():
        return False
    if multiprocessing.current_process().daemon:  # multiprocessing lets a daemonic process have no children
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    startup = _startup(environment)
    return _server_environment is None or _server_environment == startup


def start_forked(
    module_args: list[str],
    environment: dict[str, str],
    *,
    stdout: IO[bytes] | int | None,
    stderr: IO[bytes] | int | None,
) -> PreloadedProcess:
    """Start ``python -m MODULE ARGS`` with ``environment`` as a fork of the preloaded server.

    ``stdout``/``stderr`` as for :class:`subprocess.Popen`: a file, a descriptor, ``None`` (this
    process's), ``subprocess.PIPE`` (read from ``.stderr``) or, for ``stderr``, ``subprocess.STDOUT``.
    """
    global _server_environment
    context = multiprocessing.get_context("forkserver")
    if _server_environment is None:
        # An installed console script as ``__main__`` is imported once there, not again in each process.
        context.set_forkserver_preload([*PRELOAD, *(["__main__"] if _main_is_console_script() else [])])
        _server_environment = _startup(environment)
    read_end = None
    out_fd = _descriptor(stdout, 1)
    if stderr == subprocess.PIPE:
        read_end, err_fd = os.pipe()
    else:
        err_fd = out_fd if stderr == subprocess.STDOUT else _descriptor(stderr, 2)
    cwd = os.getcwd()
    # ``python -m`` puts the working folder first (unless PYTHONSAFEPATH says not to), then PYTHONPATH.
    search_path = [*([] if environment.get("PYTHONSAFEPATH") else [cwd]), *_python_path(environment)]
    process = context.Process(
        target=_run_module,
        args=(
            module_args,
            environment,
            cwd,
            [*search_path, *_interpreter_path()],
            _Descriptor(out_fd),
            _Descriptor(err_fd),
        ),
        name=f"scaletrain:{' '.join(module_args[:1])}",
    )
    try:
        process.start()
    finally:
        if read_end is not None:
            os.close(err_fd)  # the child holds its own copy; the reader sees EOF when the child ends
    return PreloadedProcess(process, os.fdopen(read_end, "rb") if read_end is not None else None)


class PreloadedProcess:
    """A forked process seen through the part of :class:`subprocess.Popen` the launcher uses."""

    def __init__(self, process: multiprocessing.process.BaseProcess, stderr: IO[bytes] | None) -> None:
        self._process = process
        self.pid = process.pid
        self.stderr = stderr

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode

    def poll(self) -> int | None:
        return self._process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, signum: int) -> None:
        if self._process.exitcode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Descriptor:
    """A file descriptor of the launcher that the forked process receives (sent beside the pickled call)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(duplicate) -> int:
    return duplicate.detach()


def _run_module(
    module_args: list[str], environment: dict[str, str], cwd: str, search_path: list[str], stdout: int, stderr: int
) -> None:
    """In the forked process: become ``python -m MODULE ARGS`` and run it to its exit.

    ``search_path``: the ``sys.path`` that ``python -m`` would have (the working folder, then
    ``PYTHONPATH``, then the interpreter's own), not the launcher's: what the launcher alone can
    import, a process started elsewhere could not import either.
    """
    _die_with_server()
    os.dup2(stdout, 1)
    os.dup2(stderr, 2)
    for fd in {stdout, stderr} - {1, 2}:
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)  # putenv too: C code reading the environment sees the rank's
    sys.path[:] = search_path
    importlib.invalidate_caches()
    module, *arguments = module_args
    sys.argv = [module, *arguments]
    import runpy

    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a module that returns without exiting ends as ``python -m`` would: code 0


def _die_with_server() -> None:
    """Get SIGKILL when the fork server dies: it exits when the launcher does, so no process is orphaned."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(1)


def _descriptor(stream: IO[bytes] | int | None, default: int) -> int:
    if stream is None:
        return default
    return stream if isinstance(stream, int) else stream.fileno()


def _python_path(environment: dict[str, str]) -> list[str]:
    return [os.path.abspath(entry) for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]


@functools.cache
def _interpreter_path() -> tuple[str, ...]:
    """This interpreter's ``sys.path`` without ``PYTHONPATH`` and the script's folder (asked once, of a new one)."""
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    found = subprocess.run(
        [sys.executable, "-c", "import json, sys; print(json.dumps([entry for entry in sys.path if entry]))"],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return tuple(json.loads(found.stdout))


def _startup(environment: dict[str, str]) -> dict[str, str]:
    return {key: value for key, value in environment.items() if key.startswith(STARTUP_PREFIXES)} | {
        "executable": sys.executable
    }


def _main_is_safe() -> bool:
    """Whether multiprocessing's children may import this process's ``__main__`` without running a user's script.

    ``python -m PACKAGE`` (``scaletrain``, ``pytest``) is named ``PACKAGE.__main__``, which
    multiprocessing does not import again; an installed console script and an interactive session are
    safe too. A script of the user's may start a run at import: its processes start with ``python -m``.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return spec.name.endswith(".__main__")
    return getattr(main, "__file__", None) is None or _main_is_console_script()


def _main_is_console_script() -> bool:
    """Whether ``__main__`` is an installed console script (``scaletrain``, ``pytest``): guarded, quick to import."""
    path = getattr(sys.modules.get("__main__"), "__file__", None)
    return path is not None and Path(path).resolve().parent == Path(sysconfig.get_path("scripts")).resolve()
