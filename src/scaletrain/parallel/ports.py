"""Where a local run's processes meet: a port free for rank 0's store, taken where outgoing connections do not
take theirs."""

from __future__ import annotations

import random
import socket
from pathlib import Path

__all__ = ["free_port"]


def free_port() -> int:
    """A port free now for rank 0's store, taken below the kernel's ephemeral range where one is known: a port
    the kernel hands out (bind to 0) can be handed again to an outgoing connection (gloo's, another run's) before
    the store listens on it, which fails the run with EADDRINUSE."""
    low = _ephemeral_low()
    for port in random.sample(range(max(1024, low - 12000), low), 64) if low > 2048 else []:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 0 where it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0
