"""The foreign engines' runs predicted from their own profiles (``scaletrain profile --framework``).

A profile whose ``Profile.framework`` is ``tensorflow`` or ``mxnet`` holds that engine's own t_grad, t_update,
contention and exchange times. The refined and the thesis model predict its runs with scaletrain's formulas, through
the terms of the strategy whose spec does what the engine's mode does: ``allreduce-join`` for TensorFlow's
``MultiWorkerMirroredStrategy`` (calibrated by the engine's all-reduce timed at N workers), ``ps-central-async`` and
``ps-sharded-async`` for ``ParameterServerStrategy`` and ``dist_async`` with one server or N. MXNet's ``dist_sync``
(``allreduce-join``) has the *kvstore* term instead: every worker pushes its gradient to S = N server processes and
pulls the sum back, a key lying whole on server ``(k · 9973) mod S`` unless it has 10⁶ values or more (then split
over all), as MXNet 1.9 places them; a step's exchange is 2 latencies + (gradient + weight bytes) ×
max(1, N · largest share) / bandwidth, then every worker's t_update, corrected by ``Profile.kvstore`` where timed.
Any other spec is refused (:data:`ENGINE_SPECS`, the same as :data:`scaletrain.engines.layouts.FOREIGN_STRATEGIES`):
the engine does not run it. docs/frameworks.md has the table and how well it predicts.

>>> from scaletrain.estimate.profile import Profile
>>> profile = Profile("lenet", 64, t_grad=0.02, t_comm=0.001, framework="mxnet")
>>> model_spec(profile, "allreduce-join"), model_spec(profile, "ps-sharded-async")
('kvstore-join', 'ps-sharded-async')
>>> model_spec(profile, "ps-central-join")
Traceback (most recent call last):
scaletrain.errors.ConfigError: ps-central-join: a mxnet profile predicts the mxnet engine's runs, and it runs allreduce-join, ps-central-async, ps-sharded-async
"""  # noqa: E501

from __future__ import annotations

import numpy as np

from scaletrain.errors import ConfigError
from scaletrain.parallel.strategies.terms import StepInputs, calibrated_seconds, gradient_bytes, weight_bytes

__all__ = ["ENGINE_SPECS", "KVSTORE", "engine_exchange", "kvstore_exchange", "model_spec", "mxnet_shares"]

KVSTORE = "kvstore-join"  # the engine-specific synchronous term: MXNet's dist_sync
#: per foreign framework: the bench spec its engine runs → the spec whose model terms predict it
ENGINE_SPECS: dict[str, dict[str, str]] = {
    "tensorflow": {
        "allreduce-join": "allreduce-join",
        "ps-central-async": "ps-central-async",
        "ps-sharded-async": "ps-sharded-async",
    },
    "mxnet": {
        "allreduce-join": KVSTORE,
        "ps-central-async": "ps-central-async",
        "ps-sharded-async": "ps-sharded-async",
    },
}
BIGARRAY_BOUND = 1_000_000  # values: MXNet splits a key this large over every server (MXNET_KVSTORE_BIGARRAY_BOUND)
KEY_HASH = 9973  # MXNet places a smaller key k on server (k · 9973) mod S


def model_spec(profile: object, spec: str) -> str:
    """The spec whose terms predict ``spec`` for the profile's framework (scaletrain's own: ``spec`` itself);
    a spec the engine does not run is one line."""
    framework = getattr(profile, "framework", "scaletrain")
    if framework == "scaletrain":
        return spec
    runs = ENGINE_SPECS.get(framework)
    if runs is None:
        raise ConfigError(f"the profile's framework {framework!r} is none of scaletrain, {', '.join(ENGINE_SPECS)}")
    if spec not in runs:
        raise ConfigError(
            f"{spec}: a {framework} profile predicts the {framework} engine's runs, and it runs {', '.join(runs)}"
        )
    return runs[spec]


def engine_exchange(profile: object, spec: str):
    """The engine-specific synchronous exchange standing for ``spec`` (None: the strategy's own terms)."""
    return kvstore_exchange if model_spec(profile, spec) == KVSTORE else None


def mxnet_shares(tensor_bytes: tuple[int, ...], servers: int, bytes_per_value: float = 4.0) -> list[float]:
    """The fraction of the weight bytes each of ``servers`` MXNet servers holds, keys in the profile's order.

    >>> [round(s, 3) for s in mxnet_shares((2000, 80, 1_600_000, 20), 2)]  # keys 0 and 2 on server 0
    [1.0, 0.0]
    >>> mxnet_shares((8_000_000,), 4)  # 2·10⁶ values: split over all four
    [0.25, 0.25, 0.25, 0.25]
    """
    held = [0.0] * servers
    for key, size in enumerate(tensor_bytes):
        if size / bytes_per_value >= BIGARRAY_BOUND:
            for server in range(servers):
                held[server] += size / servers
        else:
            held[(key * KEY_HASH) % servers] += size
    total = sum(held) or 1.0
    return [value / total for value in held]


def kvstore_exchange(inputs: StepInputs, n: np.ndarray) -> np.ndarray:
    """MXNet ``dist_sync``'s step besides the gradient, per worker count (see the module's text)."""
    profile = inputs.profile
    sizes = tuple(profile.tensor_bytes) or (weight_bytes(profile),)

    def formula(workers: int) -> float:
        if workers <= 1:
            return float(profile.t_update)
        busiest = max(1.0, workers * max(mxnet_shares(sizes, workers)))
        moved = (gradient_bytes(profile) + weight_bytes(profile)) * busiest / profile.bytes_per_second
        return float(2 * profile.latency + moved + profile.t_update)

    return calibrated_seconds(profile, getattr(profile, "kvstore", {}), n, formula)
