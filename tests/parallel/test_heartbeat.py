"""Heartbeats name the process that stopped, and only that one: a process that finished its part and
left is not called stopped, and a heartbeat outlives a store too busy to answer one beat."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch.distributed as dist

from scaletrain.parallel.heartbeat import Heartbeat
from scaletrain.parallel.rendezvous import Rendezvous


@pytest.fixture
def store_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    master = dist.TCPStore(
        "127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=10)
    )
    yield port
    del master


def heartbeat(rank: int, port: int) -> Heartbeat:
    rendezvous = Rendezvous(rank=rank, world_size=3, master_addr="127.0.0.1", master_port=port)
    return Heartbeat(rendezvous, connect_timeout=10)


def test_a_process_that_finished_is_not_named_as_stopped(store_port: int) -> None:
    survivor, finished, frozen = (heartbeat(rank, store_port) for rank in range(3))
    try:
        finished.stop(finished=True)
        frozen.stop()  # as a process that stops beating without finishing: killed or frozen
        assert survivor.silent_ranks() == [2]
        assert survivor.finished_ranks() == [1]
    finally:
        survivor.stop()
