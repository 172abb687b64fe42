"""Worker processes forked from a process that has imported torch and scaletrain once.

A fresh ``python -m scaletrain.parallel.worker`` spends about 2.5 CPU-seconds before its first step:
importing torch, then ``torch._dynamo`` (which every ``torch.optim`` optimizer imports when it is made),
then scaletrain. The local launcher pays that once per launching process instead: it starts Python's
``forkserver`` (:mod:`multiprocessing`) with those modules preloaded, and each rank is a fork of it.
The forked process is set up as the ``python -m`` one would be: the rank's environment, the
launcher's working folder, the ``sys.path`` of ``python -m`` (the working folder, ``PYTHONPATH``, the
interpreter's own folders; not the launcher's), its output on the files given, death with the
launcher (``PR_SET_PDEATHSIG`` on the fork server, which exits with the launcher), the same exit
codes, and no import of the launcher's ``__main__`` (a user's script).

The launcher falls back to ``python -m`` where a fork would not be the same process:
``SCALETRAIN_WORKER_START=exec``, a process that must start in another network namespace, a launcher
whose environment changed since the fork server started in a variable read when torch or Python
starts (``PYTHON*``, ``LD_*``, ``OMP_*``, thread and allocator settings), and a launcher that is
itself a daemonic :mod:`multiprocessing` process (which may not have children).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import subprocess
import sys
import types
from collections.abc import Callable, Iterator
from multiprocessing import reduction
from typing import IO

__all__ = [
    "ENV_WORKER_START",
    "PreloadedProcess",
    "can_fork",
    "child_search_path",
    "die_with_parent",
    "interpreter_path",
    "start_forked",
    "start_fresh",
    "start_module",
]

#: ``exec`` makes the launcher start every process with ``python -m`` (the behaviour before forking).
ENV_WORKER_START = "SCALETRAIN_WORKER_START"
#: What the fork server imports before it forks anyone (``torch._dynamo``: every optimizer imports it).
PRELOAD = ["torch", "torch._dynamo", "scaletrain.parallel.worker"]
#: Environment variables read when Python, glibc, OpenMP or torch start: a change needs a fresh process.
STARTUP_PREFIXES = ("PYTHON", "LD_", "OMP_", "GOMP_", "KMP_", "MKL_", "MALLOC_", "TORCH", "PYTORCH", "CUDA")
#: Of those, the variables read later after all, which a fork takes over: inductor sets its cache folder in the
#: environment at its first compilation (``--compile``) and reads it at each.
READ_LATER = ("TORCHINDUCTOR_CACHE_DIR",)

PR_SET_PDEATHSIG = 1

_server_environment: dict[str, str] | None = None  # the startup variables the fork server began with


def can_fork(environment: dict[str, str]) -> bool:
    """Whether a process with ``environment`` may be a fork of this launcher's preloaded server."""
    if environment.get(ENV_WORKER_START, "fork") == "exec":
        return False
    if multiprocessing.current_process().daemon:  # multiprocessing lets a daemonic process have no children
        return False
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return False
    startup = _startup(environment)
    return _server_environment is None or _server_environment == startup


def start_module(
    module_args: list[str],
    environment: dict[str, str],
    *,
    stdout: IO[bytes] | int | None,
    stderr: IO[bytes] | int | None,
) -> PreloadedProcess | subprocess.Popen:
    """``python -m MODULE ARGS`` with ``environment``, dying with this process: a fork of the preloaded
    server where it can be (:func:`can_fork`), a process of its own otherwise."""
    if can_fork(environment):
        return start_forked(module_args, environment, stdout=stdout, stderr=stderr)
    return subprocess.Popen(
        [sys.executable, "-m", *module_args], env=environment, stdout=stdout, stderr=stderr, preexec_fn=die_with_parent
    )


def start_fresh(target: Callable[..., object], args: tuple) -> multiprocessing.process.BaseProcess:
    """Start ``target(*args)`` in a process as fresh as a new interpreter, and return it.

    A fork of the preloaded server (this process's environment and working folder applied; it dies
    with this process) where it can be (:func:`can_fork`), a spawned interpreter otherwise. ``target``
    and ``args`` must pickle.
    """
    environment = dict(os.environ)
    if not can_fork(environment):
        process = multiprocessing.get_context("spawn").Process(target=target, args=args)
        process.start()
        return process
    process = _server(environment).Process(target=_call_fresh, args=(environment, os.getcwd(), target, args))
    with _main_hidden():
        process.start()
    return process


def die_with_parent() -> None:
    """In a child before exec: get SIGKILL when the launcher dies, so no process is orphaned."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


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
    context = _server(environment)
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
            [*search_path, *interpreter_path()],
            _Descriptor(out_fd),
            _Descriptor(err_fd),
        ),
        name=f"scaletrain:{' '.join(module_args[:1])}",
    )
    try:
        with _main_hidden():
            process.start()
    finally:
        if read_end is not None:
            os.close(err_fd)  # the child holds its own copy; the reader sees EOF when the child ends
    return PreloadedProcess(process, os.fdopen(read_end, "rb") if read_end is not None else None)


def _server(environment: dict[str, str]) -> multiprocessing.context.BaseContext:
    """The fork server's context, its preload set before it first starts."""
    global _server_environment
    context = multiprocessing.get_context("forkserver")
    if _server_environment is None:
        context.set_forkserver_preload(PRELOAD)
        _server_environment = _startup(environment)
    return context


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
    """In the forked process: become ``python -m MODULE ARGS`` and run it to its exit (``os._exit``: the
    interpreter's exit handlers do not run, as in scaletrain's own processes, which leave that way).

    ``search_path``: the ``sys.path`` that ``python -m`` would have (the working folder, then
    ``PYTHONPATH``, then the interpreter's own), not the launcher's: what the launcher alone can
    import, a process started elsewhere could not import either.
    """
    _die_with_server()
    _release_server()
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

    # ``python -m`` runs the module as ``__main__`` only; the server preloaded it under its own name, which
    # runpy would warn about on the terminal (the package and its other modules stay imported).
    sys.modules.pop(module, None)
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # a module that returns without exiting ends as ``python -m`` would: code 0


def _call_fresh(environment: dict[str, str], cwd: str, target: Callable[..., object], args: tuple) -> None:
    """In the forked process: take over the requester's environment and folder, then call ``target``."""
    _die_with_server()
    _release_server()
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environment)
    target(*args)


def _die_with_server() -> None:
    """Get SIGKILL when the fork server dies: it exits when the launcher does, so no process is orphaned."""
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(1)


@contextlib.contextmanager
def _main_hidden() -> Iterator[None]:
    """Send the request without this process's ``__main__``: multiprocessing would import it again in the
    child (a user's script, which may start a run at import), and ``python -m MODULE`` never does."""
    main = sys.modules["__main__"]
    sys.modules["__main__"] = types.ModuleType("__main__")  # no file and no spec: nothing to import
    try:
        yield
    finally:
        sys.modules["__main__"] = main


def _release_server() -> None:
    """Close the fork server's lifeline that multiprocessing hands every fork.

    The server exits when the write ends of that pipe are closed: its launcher's, and each fork's
    (given so that a fork could ask the server for processes of its own). A fork holding it would keep
    the server, and through ``PR_SET_PDEATHSIG`` itself and every other fork, alive after the launcher
    died; tests/parallel/test_preloaded.py checks that they die.
    """
    server = getattr(multiprocessing.forkserver, "_forkserver", None)
    lifeline = getattr(server, "_forkserver_alive_fd", None)
    if lifeline is not None:
        os.close(lifeline)
        server._forkserver_alive_fd = None


def _descriptor(stream: IO[bytes] | int | None, default: int) -> int:
    if stream is None:
        return default
    return stream if isinstance(stream, int) else stream.fileno()


def _python_path(environment: dict[str, str]) -> list[str]:
    return [os.path.abspath(entry) for entry in environment.get("PYTHONPATH", "").split(os.pathsep) if entry]


@functools.cache
def interpreter_path() -> tuple[str, ...]:
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
    """The variables a fork cannot take over from ``environment`` (``PYTHONPATH`` it can: it sets ``sys.path``)."""
    read_at_start = {
        key: value for key, value in environment.items() if key.startswith(STARTUP_PREFIXES) and key not in READ_LATER
    }
    return {**read_at_start, "PYTHONPATH": "", "executable": sys.executable}


def child_search_path(package_root: str) -> list[str]:
    """The children's ``PYTHONPATH``: scaletrain's folder, this process's ``sys.path`` beyond the interpreter's own
    (a script's folder, what it inserted, ``PYTHONPATH``), then ``PYTHONPATH`` as given; each folder once."""
    own = set(interpreter_path())
    launcher = [os.path.abspath(entry or os.curdir) for entry in sys.path if os.path.abspath(entry or os.curdir)]
    given = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    entries = [package_root, *(entry for entry in launcher if entry not in own and os.path.isdir(entry)), *given]
    return list(dict.fromkeys(entries))
