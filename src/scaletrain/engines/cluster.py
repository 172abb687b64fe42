"""A foreign run in pods: the run's settings as the JSON a deployment's ConfigMap holds, and the step that
makes each pod's inputs from them (``scaletrain engines prepare``, the pods' init container).

Every pod prepares for itself, into a folder of its own (an ``emptyDir``), the files a local run's launcher
prepares once (:func:`scaletrain.engines.prepare.prepare`: ``spec.json``, ``order.npz``, ``init.npz``, and
``tokens.npz`` for a text) and a copy of the engine's programs. The preparation is seeded (the sampler, the
model's first weights), so every pod of a run reads the same files, and no pod waits for another. The spec's
``out``, where the programs write their figures, weights and quality, is the run folder on the shared
volume instead, so that what they write outlives the pods and TensorFlow's servers see the chief's mark
that the run is over.

    >>> from scaletrain.engines.layouts import engine_run
    >>> run = engine_run("mxnet", "lenet", "allreduce-join", 2, {"steps": 10})
    >>> load_run(run_json(run)) == run
    True
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Any

from scaletrain.engines.base import PROGRAMS
from scaletrain.engines.launch import check_run
from scaletrain.engines.prepare import SPEC_NAME, EngineRun, prepare
from scaletrain.errors import ConfigError

__all__ = ["PROGRAMS_FOLDER", "RUN_FILE", "load_run", "prepare_pod", "run_json"]

#: the run's settings in the ConfigMap, beside ``run.toml`` of scaletrain's own runs
RUN_FILE = "engine.json"
#: where, in the folder a pod prepares, the copy of the programs goes
PROGRAMS_FOLDER = "programs"


def run_json(run: EngineRun) -> str:
    """``run`` as JSON, every field by name (the data folder as a string)."""
    fields = dataclasses.asdict(run)
    fields["data_dir"] = str(run.data_dir) if run.data_dir is not None else None
    return json.dumps(fields, indent=2) + "\n"


def load_run(text: str) -> EngineRun:
    """The :class:`EngineRun` that :func:`run_json` wrote; one line naming what is wrong otherwise."""
    try:
        fields = json.loads(text)
        if fields.get("data_dir") is not None:
            fields["data_dir"] = Path(fields["data_dir"])
        return EngineRun(**fields)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError(
            f"not a foreign run's settings as scaletrain deploy writes them ({RUN_FILE}): {exc}"
        ) from None


def prepare_pod(settings: Path, into: Path, results: Path) -> dict[str, Any]:
    """Check the engine is installed here, then write ``into`` what the program reads (its spec naming
    ``results`` as ``out``) and a copy of the programs; the spec."""
    try:
        text = Path(settings).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read {settings}: {exc.strerror}") from None
    run = load_run(text)
    check_run(run)  # installed in this image, and runs this workload and mode
    spec = prepare(run, into)
    shutil.copytree(PROGRAMS, into / PROGRAMS_FOLDER, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
    results.mkdir(parents=True, exist_ok=True)
    spec["out"] = str(results)
    (into / SPEC_NAME).write_text(json.dumps(spec, indent=2) + "\n", encoding="utf-8")
    return spec
