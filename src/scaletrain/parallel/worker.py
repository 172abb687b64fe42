"""Entry point of each process the local launcher starts: ``python -m scaletrain.parallel.worker CONFIG [WORKLOAD]``.

``CONFIG`` is the run's configuration as JSON; ``WORKLOAD``, a pickled workload object to train instead
of making the configuration's (:mod:`scaletrain.parallel.handover`). The rank and the rendezvous come
from the torchrun environment variables the launcher sets.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from pathlib import Path

from scaletrain.config import from_json_dict
from scaletrain.errors import ScaletrainError
from scaletrain.parallel.failures import ProcessFailed
from scaletrain.parallel.handover import receive_workload
from scaletrain.parallel.launch import ENV_LAUNCHER
from scaletrain.parallel.process import run_process
from scaletrain.parallel.rendezvous import Rendezvous
from scaletrain.parallel.teardown import exit_now
from scaletrain.plugins import load_plugins


def thread_tracebacks_to_log() -> None:
    """Under the local launcher, a background thread's traceback goes to this process's log (its stdout), not
    to the terminal the launcher shows its stderr on. One seen there: on Ctrl-C, multiprocessing's thread that
    hands file descriptors to the data loader's workers lost a worker mid-handshake (ConnectionResetError), and
    reported it through ``sys.excepthook``, which goes to the log here too."""
    if not os.environ.get(ENV_LAUNCHER):
        return

    def to_log(failed: threading.ExceptHookArgs) -> None:
        if failed.exc_type is SystemExit:
            return
        name = failed.thread.name if failed.thread is not None else "a thread"
        print(f"exception in {name}:", file=sys.stdout, flush=True)
        traceback.print_exception(failed.exc_type, failed.exc_value, failed.exc_traceback, file=sys.stdout)
        sys.stdout.flush()

    def reported_to_log(kind: type[BaseException], value: BaseException, trace: object) -> None:
        # multiprocessing's fd-sharing thread reports through sys.excepthook, not threading.excepthook
        print(f"exception in {threading.current_thread().name}:", file=sys.stdout, flush=True)
        traceback.print_exception(kind, value, trace, file=sys.stdout)
        sys.stdout.flush()

    threading.excepthook = to_log
    sys.excepthook = reported_to_log


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    thread_tracebacks_to_log()
    rendezvous = Rendezvous.from_env()
    try:
        # The launcher's environment names them: the same registries in every process, filled before the
        # configuration is checked against them (its wire codec, workload or technique may be a plugin's).
        load_plugins()
        config = from_json_dict(json.loads(Path(arguments[0]).read_text(encoding="utf-8")))
        workload = receive_workload(Path(arguments[1])) if len(arguments) > 1 else None
        run_process(config, rendezvous, workload)
    except ScaletrainError as exc:
        # Under the local launcher this line goes to the log only: the launcher puts it on the terminal once.
        launched = bool(os.environ.get(ENV_LAUNCHER))
        stream = sys.stdout if launched else sys.stderr
        if exc.details and launched:  # the traceback of the user's code: in the log, before the line shown
            print(exc.details, file=stream, flush=True)
        prefix = "" if isinstance(exc, ProcessFailed) else f"rank {rendezvous.rank}: "  # it names itself
        print(f"scaletrain: error: {prefix}{exc}", file=stream, flush=True)
        return exc.exit_code
    except KeyboardInterrupt:  # Ctrl-C on a terminal reaches every process; the launcher reports it
        return 130
    return 0


if __name__ == "__main__":
    exit_now(main())
