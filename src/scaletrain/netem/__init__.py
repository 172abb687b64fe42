"""Emulated cluster networks: each process in its own network namespace behind a rate-limited link."""

from scaletrain.netem.network import EmulatedNetwork, format_rate, parse_rate

__all__ = ["EmulatedNetwork", "format_rate", "parse_rate"]
