"""``--wire powersgd``: every gradient matrix as rank-R factors, one power iteration a step.

PowerSGD (Vogels, Karimireddy & Jaggi, NeurIPS 2019; PyTorch ships it as ``powerSGD_hook``). Each gradient of two
or more dimensions is read as a matrix M of ``out × (in·k·k)``; with the last step's Q (``m × R``) every worker
computes P = M Q, the workers all-reduce P (with the tensors that go dense, in the same call), orthonormalise it,
compute Q = Mᵀ P and all-reduce Q; the sum of the workers' gradients is then about P Qᵀ. Q being the same on every
worker, the sum of the P is the P of the summed M: the reduction is linear only when all-reduce adds every P at
once (a parameter server adds payloads one worker at a time), so the servers refuse this codec (``topk`` goes
there). Sent: (n + m)·R values per matrix instead of n·m.

Vectors and matrices whose factors would not be ``min_gain`` times smaller travel dense, and so does everything for
the first ``start`` steps (the early gradients change fastest). With ``error_feedback`` each worker adds what its
last message lost to the next one; with ``warm_start`` one step's Q starts the next (one iteration a step then
converges over steps), without it each step starts from a fresh random Q, the same on every worker. Options
(``-W key=value``): ``rank`` (R ≥ 1; a narrower matrix is factored at its own width), ``start`` (≥ 0),
``warm_start`` (on/off), ``min_gain`` (≥ 0; 0 factors every matrix).

>>> codec = PowerSGD(rank=1, min_gain=0)
>>> layout = TensorLayout.of([torch.zeros(4, 3), torch.zeros(4)])
>>> codec.payload_spec(layout)  # before it starts: dense; then 4 values of P and 3 of Q, and the bias
[(16, torch.float32)]
>>> codec._steps = 1; codec.payload_spec(layout)
[(8, torch.float32), (3, torch.float32)]
"""

from __future__ import annotations

import math

import torch

from scaletrain.errors import ConfigError
from scaletrain.tensors.codec import CODECS, Collectives, TensorLayout, WireCodec

__all__ = ["PowerSGD"]

_SWITCH = {"on": True, "true": True, "1": True, "yes": True, "off": False, "false": False, "0": False, "no": False}


class PowerSGD(WireCodec):
    """Rank-``rank`` factors of every gradient matrix by one warm-started power iteration a step."""

    name = "powersgd"
    all_reduce_only = True
    feedback_by_default = True
    collective_calls = 2

    def __init__(
        self,
        error_feedback: bool = False,
        *,
        rank: int = 2,
        start: int = 0,
        warm_start: bool = True,
        min_gain: float = 1.0,
    ) -> None:
        super().__init__(error_feedback)
        self.rank, self.start, self.warm_start, self.min_gain = rank, start, warm_start, min_gain
        self._steps = 0  # all-reduces done
        self._q: dict[int, torch.Tensor] = {}  # per factored matrix (by its place in the layout)
        self._layout_id: int | None = None

    @classmethod
    def parse_options(cls, options: dict[str, object]) -> dict[str, object]:
        """``rank`` ≥ 1, ``start`` ≥ 0, ``warm_start`` on/off, ``min_gain`` ≥ 0.

        >>> PowerSGD.parse_options({"rank": "4", "warm_start": "off"})
        {'rank': 4, 'warm_start': False}
        >>> PowerSGD.parse_options({"rank": "0"})
        Traceback (most recent call last):
        ...
        scaletrain.errors.ConfigError: -W rank=0: powersgd's rank must be a whole number >= 1, e.g. -W rank=2
        """
        unknown = set(options) - {"rank", "start", "warm_start", "min_gain"}
        if unknown:
            raise ConfigError(
                f"wire codec powersgd has no option {', '.join(sorted(unknown))}; it takes rank, start, warm_start, "
                "min_gain (-W rank=2)"
            )
        parsed: dict[str, object] = {}
        for key, low, example in (("rank", 1, "-W rank=2"), ("start", 0, "-W start=100")):
            if key in options:
                parsed[key] = _whole(options[key], key, low, example)
        if "warm_start" in options:
            value = str(options["warm_start"]).strip().lower()
            if value not in _SWITCH:
                raise ConfigError(f"-W warm_start={options['warm_start']}: say on or off")
            parsed["warm_start"] = _SWITCH[value]
        if "min_gain" in options:
            try:
                gain = float(options["min_gain"])  # type: ignore[arg-type]
            except (TypeError, ValueError):
                gain = math.nan
            if not (math.isfinite(gain) and gain >= 0):
                raise ConfigError(f"-W min_gain={options['min_gain']}: must be a number >= 0, e.g. -W min_gain=1")
            parsed["min_gain"] = gain
        return parsed

    def check_network(self, shapes: list[torch.Size]) -> None:
        widest = max((min(s[0], math.prod(s[1:])) for s in shapes if len(s) >= 2), default=0)
        if self.rank > widest:
            raise ConfigError(
                f"-W rank={self.rank}: the network's widest gradient matrix allows rank {widest} at most "
                f"(min of its rows and columns); use -W rank={max(1, min(widest, 4))}"
            )

    # -- which tensors are factored, and how -----------------------------------------------------------
    def _plan(self, layout: TensorLayout) -> list[tuple[int, int, int, int, int]]:
        """``(index, offset, n, m, r)`` of every tensor that is factored."""
        plan, offset = [], 0
        for index, shape in enumerate(layout.shapes):
            numel = math.prod(shape)
            if len(shape) >= 2:
                n, m = shape[0], numel // shape[0]
                r = min(self.rank, n, m)
                if n * m > self.min_gain * (n + m) * r:
                    plan.append((index, offset, n, m, r))
            offset += numel
        return plan

    def _dense_mask(
        self, layout: TensorLayout, plan: list[tuple[int, int, int, int, int]], device: torch.device
    ) -> torch.Tensor:
        mask = torch.ones(layout.numel, dtype=torch.bool, device=device)
        for _, offset, n, m, _ in plan:
            mask[offset : offset + n * m] = False
        return mask

    def payload_spec(self, layout: TensorLayout) -> list[tuple[int, torch.dtype]]:
        """The last all-reduce's two messages (dense and P; Q), or the one dense message of a step before
        ``start``."""
        if self._steps <= self.start or not layout.shapes:
            return [(layout.numel, torch.float32)]
        return self._factored_spec(layout)

    def steady_payload_bytes(self, layout: TensorLayout) -> int:
        return sum(count * dtype.itemsize for count, dtype in self._factored_spec(layout))

    def _factored_spec(self, layout: TensorLayout) -> list[tuple[int, torch.dtype]]:
        plan = self._plan(layout)
        factored = sum(n * m for _, _, n, m, _ in plan)
        return [
            (layout.numel - factored + sum(n * r for _, _, n, _, r in plan), torch.float32),
            (sum(m * r for _, _, _, m, r in plan), torch.float32),
        ]

    def compress(
        self, flat: torch.Tensor, layout: TensorLayout, stream: object = None
    ) -> tuple[list[torch.Tensor], TensorLayout]:
        raise ConfigError("wire codec powersgd runs under all-reduce only; use --wire topk with a parameter server")

    def reset(self) -> None:
        super().reset()
        self._q.clear()

    def steady(self) -> PowerSGD:
        """Past the dense start: the next all-reduce is the first to factor.

        >>> codec = PowerSGD(rank=1, start=100).steady()
        >>> codec._steps == codec.start
        True
        """
        self._steps = max(self._steps, self.start)
        return self

    def allreduce(
        self, flat: torch.Tensor, layout: TensorLayout, *, stream: object = None, collectives: Collectives | None = None
    ) -> torch.Tensor:
        collectives = collectives or Collectives()
        self._steps += 1
        if self._steps <= self.start:
            collectives.all_reduce(flat)  # float32 as it is: nothing lost, nothing carried
            return flat
        if layout.layout_id != self._layout_id:  # another network: nothing carried fits it
            self.reset()
            self._layout_id = layout.layout_id
        world = collectives.world_size
        corrected = self.corrected(flat, stream) if self.error_feedback else flat
        plan = self._plan(layout)
        dense = self._dense_mask(layout, plan, flat.device)
        matrices = [corrected[offset : offset + n * m].view(n, m) for _, offset, n, m, _ in plan]
        qs = [self._start_q(index, m, r, flat.device) for index, _, _, m, r in plan]
        # one all-reduce for the dense values and every P, one for every Q
        first = torch.cat(
            [corrected[dense], *[(matrix @ q).reshape(-1) for matrix, q in zip(matrices, qs, strict=True)]]
        )
        collectives.all_reduce(first)
        dense_count = int(dense.sum())
        ps, at = [], dense_count
        for _, _, n, _, r in plan:
            ps.append(_orthonormal(first[at : at + n * r].view(n, r)))
            at += n * r
        second = torch.cat(
            [torch.zeros(0), *[(matrix.T @ p).reshape(-1) for matrix, p in zip(matrices, ps, strict=True)]]
        )
        if plan:
            collectives.all_reduce(second)
        total = torch.empty_like(flat)
        total[dense] = first[:dense_count]
        at = 0
        for (index, offset, n, m, r), p in zip(plan, ps, strict=True):
            q = second[at : at + m * r].view(m, r)
            at += m * r
            total[offset : offset + n * m] = (p @ q.T).reshape(-1)
            if self.warm_start:
                self._q[index] = q.clone()
        if self.error_feedback:  # what this worker's message lost: its gradient less the mean that came back
            self.carry(stream, corrected, total / world)
        return total

    def _start_q(self, index: int, m: int, r: int, device: torch.device) -> torch.Tensor:
        """Last step's Q of this matrix, else a random one drawn alike on every worker."""
        q = self._q.get(index)
        if q is not None and q.shape == (m, r):
            return q
        generator = torch.Generator().manual_seed(1_000_003 * self._steps + index)
        return torch.randn(m, r, generator=generator).to(device)

    def state_dict(self) -> dict[str, object]:
        """The residuals, every matrix's last Q and the steps done: a resumed run goes on exactly."""
        q = {index: value.detach().cpu().clone() for index, value in self._q.items()}
        return {**super().state_dict(), "steps": self._steps, "q": q, "layout": self._layout_id}

    def load_state_dict(self, state: dict[str, object]) -> bool:
        if not super().load_state_dict(state):
            return False
        self._steps = int(state["steps"])  # type: ignore[call-overload]
        self._q = dict(state["q"])  # type: ignore[call-overload]
        self._layout_id = state["layout"]  # type: ignore[assignment]
        return True


def _orthonormal(matrix: torch.Tensor) -> torch.Tensor:
    """An orthonormal basis of ``matrix``'s columns (reduced QR; deterministic on every worker alike)."""
    return torch.linalg.qr(matrix, mode="reduced").Q


def _whole(value: object, key: str, low: int, example: str) -> int:
    try:
        number = int(str(value))
    except ValueError:
        number = low - 1
    if number < low:
        raise ConfigError(f"-W {key}={value}: powersgd's {key} must be a whole number >= {low}, e.g. {example}")
    return number


CODECS[PowerSGD.name] = PowerSGD
