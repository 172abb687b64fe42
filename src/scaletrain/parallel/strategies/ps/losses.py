"""What a parameter server does when a peer is lost: an elastic central server drops it and the survivors go
on (:mod:`.membership`); an elastic sharded owner gives up its own worker's wait as soon as
a peer was lost, is closed when the survivors regroup, and keeps the momentum its last update started from
(the survivors undo a step a lost peer took part in); and what an owner's checkpoint holds. A part of
:class:`~.server.ShardServer`."""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from scaletrain.parallel.heartbeat import SILENCE_SECONDS
from scaletrain.parallel.strategies.ps.membership import Members
from scaletrain.parallel.strategies.ps.protocol import PROBE, PeerLost
from scaletrain.parallel.strategies.ps.records import ServerStats
from scaletrain.tensors.flat import flatten
from scaletrain.tensors.optimizers import state_layout
from scaletrain.train.meter import now

__all__ = ["Closed", "LossHandling", "Redo"]


class LossHandling:
    """The lost-peer half of a shard server (its attributes are the server's)."""

    master: list[nn.Parameter]
    optimizer: torch.optim.Optimizer
    peers: dict[int, dist.ProcessGroup]
    members: Members | None
    lost: Callable[[], bool] | None
    stats: ServerStats
    timeout: float
    version: int
    contributors: int
    closed: bool
    _before: tuple[int, dict[str, torch.Tensor]] | None
    _condition: threading.Condition
    _failure: tuple[int, str] | None
    _arrived: int
    _probed: dict[int, float]

    def _dropped(self, peer: int, reason: str) -> bool:
        """An elastic server's survivors go on without ``peer`` (the update in flight is done again by them);
        False when the run cannot (not elastic, or fewer than ``--min-workers`` would be left). Under the lock."""
        why = "stopped answering" if "stopped answering" in reason else "died"
        if self.members is None or not self.members.drop(peer, why, self.version):
            return False
        self.contributors = len(self.members.active)
        self._arrived = 0  # the update in flight is not made: its gradients come again
        return True

    def _wait_round(self, done: Callable[[], bool], own: bool = False) -> bool:
        """Wait (holding the lock between waits) until ``done()``, at most ``--timeout``; an elastic server also
        drops a peer whose heartbeat stood still meanwhile, and waits twice as long (a lost peer's own wait
        on its pair runs out first: it began before this one). ``own``: the owner's worker waits (an elastic
        sharded one gives up as soon as ``lost()`` says a peer was lost)."""
        if self.members is None and (self.lost is None or not own):
            return self._condition.wait_for(done, timeout=self.timeout)
        if self.members is None:
            deadline = now() + self.timeout
            while not self._condition.wait_for(done, timeout=0.1):
                if self.lost():
                    raise PeerLost("another worker saw a peer lost during this update")
                if now() > deadline:
                    return False
            return True
        deadline = now() + 2 * self.timeout
        while not done():
            closed = [peer for peer in self.members.silent(SILENCE_SECONDS) if self._closed(peer)]
            for peer in closed:
                self._lose(peer, f"lost the connection to worker rank {peer}: it died or its machine went away")
            for peer in self.members.silent():
                self._lose(peer, f"no heartbeat from worker rank {peer}: it stopped answering (frozen, or unreachable)")
            if done() or now() > deadline:
                return done()
            self._condition.wait(timeout=0.1)
        return True

    def _lose(self, peer: int, reason: str) -> None:
        """An elastic server's peer found lost while it waits (under the lock): dropped, or the run stops."""
        self.stats.lost[peer] = reason
        if not self._dropped(peer, reason):
            self._failure = self._failure or (peer, reason)

    def _closed(self, peer: int) -> bool:
        """Whether ``peer``'s connection closed (it died), asked by a send it never receives; at most once a
        second per peer. A peer that is alive leaves the send pending (kept referenced: freeing it would wait)."""
        clock = now()
        if clock - self._probed.get(peer, float("-inf")) < 1.0:
            return False
        self._probed[peer] = clock
        try:
            _PROBES.append(dist.isend(torch.zeros(1), dst=peer, group=self.peers[peer], tag=PROBE))
        except RuntimeError:
            return True
        return False

    def close(self) -> None:
        """The survivors of a lost peer regrouped (elastic sharded): apply nothing more, and let every thread end
        without a word (its group is left behind)."""
        with self._condition:
            self.closed = True
            self._condition.notify_all()

    def state_at(self, version: int) -> dict[str, torch.Tensor] | None:
        """The master tensors' optimizer state after ``version`` updates, each key one flat buffer (a scalar per
        tensor for a scalar key such as Adam's ``step``): the current one, or the one before the last update (a
        step the survivors of a lost peer undo); None when neither is that version."""
        with self._condition:
            if version == self.version:
                return self._state()
            if self._before is not None and self._before[0] == version:
                return self._before[1]
            return None

    def saved(self) -> dict[str, Any]:
        """The master tensors, their optimizer's state and the version, for a checkpoint of a run whose owners keep
        state of their own (diloco's outer step); taken between updates, as :meth:`restore` takes it back."""
        with self._condition:
            master = [parameter.detach().clone() for parameter in self.master]
            return {"master": master, "optimizer": copy.deepcopy(self.optimizer.state_dict()), "version": self.version}

    def restore(self, saved: dict[str, Any]) -> None:
        with self._condition, torch.no_grad():
            for parameter, value in zip(self.master, saved["master"], strict=True):
                parameter.copy_(value)  # in place: the master tensors are views of the flat buffer replies send
            self.optimizer.load_state_dict(saved["optimizer"])
            self.version = saved["version"]

    def _state(self) -> dict[str, torch.Tensor]:
        if getattr(self, "_layout", None) is None:  # learned once: a step of a like optimizer
            self._layout = state_layout(self.optimizer)
        whole, scalars = self._layout
        state = self.optimizer.state
        flat = {key: flatten([state.get(p, {}).get(key, torch.zeros_like(p)) for p in self.master]) for key in whole}
        return flat | {
            key: torch.tensor([float(state.get(p, {}).get(key, 0)) for p in self.master], dtype=torch.float64)
            for key in scalars
        }

    def _generation(self) -> int:
        return self.members.generation if self.members is not None else 0


#: Probe sends left pending on live peers (see LossHandling._closed), referenced until the process leaves.
_PROBES: list[dist.Work] = []


class Closed(Exception):
    """The server was closed (elastic sharded: the survivors regrouped) while a thread was in an update."""


class Redo(Exception):
    """The gradient belongs to the step in flight of a membership that changed: the peer must do it again."""
