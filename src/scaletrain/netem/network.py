"""Emulated cluster networks: one Linux network namespace per host, joined by rate-limited veth links.

Each host of an :class:`EmulatedNetwork` is a network namespace with a single interface, one end
of a veth pair whose other end is a port of a Linux bridge in the root namespace (the "switch").
A ``tbf`` qdisc on both ends limits the host's uplink and its downlink to the same rate, like a
full-duplex NIC on a switch. A process started with :meth:`EmulatedNetwork.command_prefix` sees
only that interface (and its own ``lo``), so whatever it sends to another host crosses the
emulated links, however it was written (c10d/gloo, sockets, a parameter server).

Example (as root)::

    with EmulatedNetwork(2, parse_rate("100mbit")) as net:
        subprocess.run(net.command_prefix(1) + ["ping", "-c1", net.address(0)], check=True)

Everything the network creates is deleted when the ``with`` block ends, also when the block or
the creation itself failed, and at interpreter exit for a network that was never closed.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import threading
from types import TracebackType

from scaletrain.errors import ConfigError

__all__ = ["EmulatedNetwork", "format_rate", "parse_rate"]

log = logging.getLogger(__name__)

# Linux refuses interface names longer than IFNAMSIZ - 1.
_IFNAME_MAX = 15
_COMMAND_TIMEOUT_S = 30
# tbf: a bucket of at least 1/_BURST_HZ seconds of traffic, and never less than _MIN_BURST_BYTES.
# The bucket must hold what can be sent between two timer ticks (rate/HZ, HZ = 250 here) or tbf
# falls short of its rate at high rates; the 32 KiB floor keeps low rates from stalling on the
# GSO packets of veth (tbf splits one larger than the bucket, but a bucket near one MTU makes TCP
# crawl). tbf counts whole frames, Ethernet header included, so TCP goodput is ~95.6 % of the
# rate, as on a real link; measured so from 1 Mbit/s to 2 Gbit/s (10 Gbit/s is CPU-bound here).
_BURST_HZ = 250
_MIN_BURST_BYTES = 32 * 1024
# How long a packet may wait in the tbf queue before it is dropped; with the burst this sets the
# queue's byte limit. 50 ms is a queue a real switch port might have: deep enough that TCP keeps
# the link full, short enough that latency under load stays plausible.
_LATENCY_MS = 50
_MIN_RATE_BITS = 1000

_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}
_RATE_RE = re.compile(r"(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?:(?P<unit>[kmgt])bit|(?P<bits>bit)?)")
_RATE_FORMS = "bits per second, optionally in kbit/mbit/gbit: 1gbit, 2.5gbit, 100mbit, 500kbit, 1000000"
_PREFIX_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def parse_rate(text: str) -> int:
    """Parse a link rate in the ``tc`` style (decimal units, bits) into bits per second.

    Byte forms (``mbps``, which ``tc`` reads as megabytes) are refused rather than guessed.

    >>> parse_rate("100mbit"), parse_rate("2.5Gbit"), parse_rate("1000000")
    (100000000, 2500000000, 1000000)
    """
    match = _RATE_RE.fullmatch(text.strip().lower())
    if match is None:
        raise ConfigError(f"unknown rate {text!r}; expected {_RATE_FORMS}")
    bits = float(match["number"]) * _UNITS[match["unit"] or ""]
    if bits < 1:
        raise ConfigError(f"rate {text!r} must be at least 1 bit per second; expected {_RATE_FORMS}")
    return round(bits)


def format_rate(bits: int) -> str:
    """Write ``bits`` per second with the largest unit that keeps it exact; ``parse_rate`` reads it back.

    >>> format_rate(100_000_000), format_rate(2_500_000_000), format_rate(1234)
    ('100mbit', '2500mbit', '1234bit')
    """
    if bits < 1:
        raise ValueError(f"a rate must be a positive number of bits per second, not {bits}")
    for unit in ("t", "g", "m", "k"):
        if bits % _UNITS[unit] == 0:
            return f"{bits // _UNITS[unit]}{unit}bit"
    return f"{bits}bit"


def _base36(number: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    text = ""
    while True:
        number, digit = divmod(number, 36)
        text = digits[digit] + text
        if number == 0:
            return text


# Unique names per instance: the pid separates concurrent test runs, the counter separates the
# networks of one process. Base 36 keeps "st" + pid + "-" + counter + suffix under 15 characters.
_COUNTER = itertools.count()
_COUNTER_SPAN = 36**2
# Networks not closed yet, closed at interpreter exit (a test that forgot its `with`, a KeyboardInterrupt).
_LIVE: set[EmulatedNetwork] = set()
_LIVE_LOCK = threading.Lock()


class EmulatedNetwork:
    """``hosts`` network namespaces on one bridge, each host's up- and downlink limited to ``rate_bits``.

    Host ``i`` gets address ``subnet`` + i + 1 (10.231.0.1 for host 0 by default). Nothing is
    created until the network is entered; use it as a context manager (or :meth:`start` and
    :meth:`close`). Needs root and the ``ip`` and ``tc`` commands of iproute2. The rate counts
    whole Ethernet frames, as a NIC's does, so one TCP stream gets ~95.6 % of it as goodput.

    Example::

        with EmulatedNetwork(2, 50_000_000) as net:
            server = subprocess.Popen(net.command_prefix(0) + [sys.executable, "server.py"])
            env = {**os.environ, **net.environment(1), "SERVER": net.address(0)}
            subprocess.run(net.command_prefix(1) + [sys.executable, "client.py"], env=env)
    """

    def __init__(
        self,
        hosts: int,
        rate_bits: int,
        *,
        prefix: str | None = None,
        subnet: str = "10.231.0.0/24",
    ) -> None:
        if hosts < 1:
            raise ConfigError(f"an emulated network needs at least one host, not {hosts}")
        if rate_bits < _MIN_RATE_BITS:
            raise ConfigError(f"link rate {rate_bits} bit/s is below the {_MIN_RATE_BITS} bit/s minimum")
        try:
            network = ipaddress.IPv4Network(subnet)
        except ValueError as error:
            raise ConfigError(f"subnet {subnet!r} is not an IPv4 network like 10.0.0.0/24: {error}") from None
        # Minus the network and broadcast addresses (a /31 or /32 has no room for hosts this way).
        if network.num_addresses - 2 < hosts:
            raise ConfigError(f"subnet {subnet} has no room for {hosts} hosts")
        self.hosts = hosts
        self.rate_bits = rate_bits
        self.subnet = network
        self._explicit_prefix = prefix is not None
        if prefix is not None:
            self._check_prefix(prefix)
        self.prefix = prefix if prefix is not None else ""
        self._namespaces: list[str] = []
        self._links: list[str] = []
        self._bridge: str | None = None
        self._started = False
        self._closed = False

    # -- names --------------------------------------------------------------------------------------------

    def _check_prefix(self, prefix: str) -> None:
        if not _PREFIX_RE.fullmatch(prefix):
            raise ConfigError(f"network prefix {prefix!r} may hold only letters, digits, '_', '-' and '.'")
        longest_suffix = max(len("br"), 1 + len(str(self.hosts - 1)))
        if len(prefix) + longest_suffix > _IFNAME_MAX:
            raise ConfigError(
                f"network prefix {prefix!r} is too long: with {self.hosts} hosts it may have at most "
                f"{_IFNAME_MAX - longest_suffix} characters (interface names are limited to {_IFNAME_MAX})"
            )

    def _names_of(self, prefix: str) -> tuple[list[str], list[str]]:
        namespaces = [f"{prefix}n{i}" for i in range(self.hosts)]
        links = [f"{prefix}br"] + [f"{prefix}h{i}" for i in range(self.hosts)]
        return namespaces, links

    def _pick_prefix(self) -> str:
        # A pid reused after a crashed run could meet that run's leftovers; skip names still in use.
        pid = _base36(os.getpid())
        for _ in range(_COUNTER_SPAN):
            prefix = f"st{pid}-{_base36(next(_COUNTER) % _COUNTER_SPAN)}"
            namespaces, links = self._names_of(prefix)
            in_use = any(os.path.exists(f"/run/netns/{name}") for name in namespaces) or any(
                os.path.exists(f"/sys/class/net/{name}") for name in links
            )
            if not in_use:
                self._check_prefix(prefix)
                return prefix
        raise ConfigError("no free emulated-network names left; delete stale 'st*' namespaces and links")

    def _require_started(self, host: int) -> None:
        if not self.prefix:
            raise RuntimeError("the emulated network has no names before it is entered")
        if not 0 <= host < self.hosts:
            raise IndexError(f"host {host} is not in this {self.hosts}-host network")

    @property
    def bridge(self) -> str:
        """The bridge (the emulated switch) in the root namespace."""
        self._require_started(0)
        return f"{self.prefix}br"

    def namespace(self, host: int) -> str:
        """Name of host ``host``'s network namespace (for ``ip netns exec``)."""
        self._require_started(host)
        return f"{self.prefix}n{host}"

    def interface(self, host: int) -> str:
        """Name of the one interface inside host ``host``'s namespace."""
        self._require_started(host)
        return f"{self.prefix}v{host}"

    def _switch_port(self, host: int) -> str:
        return f"{self.prefix}h{host}"

    def address(self, host: int) -> str:
        """IPv4 address of host ``host``: the subnet's (host + 1)-th address, e.g. 10.231.0.1 for host 0."""
        if not 0 <= host < self.hosts:
            raise IndexError(f"host {host} is not in this {self.hosts}-host network")
        return str(self.subnet.network_address + host + 1)

    def command_prefix(self, host: int) -> list[str]:
        """What to put before a command to run it inside host ``host``'s namespace.

        >>> net.command_prefix(0) + ["hostname", "-I"]  # doctest: +SKIP
        ['ip', 'netns', 'exec', 'st1a2b-0n0', 'hostname', '-I']
        """
        return ["ip", "netns", "exec", self.namespace(host)]

    def environment(self, host: int) -> dict[str, str]:
        """Variables to add to the environment of a process on host ``host``.

        ``GLOO_SOCKET_IFNAME`` makes c10d's gloo backend bind to the emulated interface; without it
        gloo picks an address from the hostname, which in a namespace may be one it cannot reach.
        Merge it into the rest: ``env = {**os.environ, **net.environment(i)}``.
        """
        return {"GLOO_SOCKET_IFNAME": self.interface(host)}

    # -- life cycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> EmulatedNetwork:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def start(self) -> None:
        """Create the bridge, the namespaces and the rate-limited links; on any failure remove them again."""
        if self._started or self._closed:
            raise RuntimeError("an EmulatedNetwork can be started only once")
        self._check_system()
        self._started = True
        if not self._explicit_prefix:
            self.prefix = self._pick_prefix()
        with _LIVE_LOCK:
            _LIVE.add(self)
        try:
            self._create()
        except BaseException:
            # __exit__ does not run when __enter__ raises, so the half-built network goes here.
            self.close()
            raise
        log.debug("emulated network %s: %d hosts at %s", self.prefix, self.hosts, format_rate(self.rate_bits))

    @staticmethod
    def _check_system() -> None:
        if os.geteuid() != 0:
            raise ConfigError("--network needs root (namespaces and tc); run as root or drop --network")
        for tool in ("ip", "tc"):
            if shutil.which(tool) is None:
                raise ConfigError(
                    f"--network needs the '{tool}' command of iproute2, which is not on PATH; "
                    "install iproute2 (apt-get install iproute2) or drop --network"
                )

    def _create(self) -> None:
        prefix_len = self.subnet.prefixlen
        bridge = f"{self.prefix}br"
        _run(["ip", "link", "add", bridge, "type", "bridge"])
        self._bridge = bridge
        _run(["ip", "link", "set", bridge, "up"])
        burst = max(self.rate_bits // 8 // _BURST_HZ, _MIN_BURST_BYTES)
        tbf = ["tbf", "rate", f"{self.rate_bits}bit", "burst", str(burst), "latency", f"{_LATENCY_MS}ms"]
        for host in range(self.hosts):
            namespace, inner, port = self.namespace(host), self.interface(host), self._switch_port(host)
            _run(["ip", "netns", "add", namespace])
            self._namespaces.append(namespace)
            # Processes that talk to localhost inside the namespace (a TCPStore, a launcher) need lo.
            _run(["ip", "-n", namespace, "link", "set", "lo", "up"])
            # Creating the inner end directly in the namespace means no half-made veth is ever
            # left behind in the root namespace under a name we did not record.
            _run(["ip", "link", "add", port, "type", "veth", "peer", "name", inner, "netns", namespace])
            self._links.append(port)
            _run(["ip", "link", "set", port, "master", bridge, "up"])
            _run(["ip", "-n", namespace, "addr", "add", f"{self.address(host)}/{prefix_len}", "dev", inner])
            _run(["ip", "-n", namespace, "link", "set", inner, "up"])
            # Uplink: what the host sends leaves through the inner end's qdisc.
            _run(["tc", "-n", namespace, "qdisc", "add", "dev", inner, "root", *tbf])
            # Downlink: what the bridge forwards to the host leaves through the switch port's qdisc.
            _run(["tc", "qdisc", "add", "dev", port, "root", *tbf])

    def close(self) -> None:
        """Kill what still runs in the namespaces and delete everything this network created.

        Safe to call more than once, and on a network that was only partly created: it deletes
        exactly what was created, so a name someone else already had is never touched. Problems
        are logged, not raised, so that closing never hides the error that made a run stop.
        """
        if self._closed:
            return
        self._closed = True
        with _LIVE_LOCK:
            _LIVE.discard(self)
        for namespace in self._namespaces:
            _kill_processes_in(namespace)
        # Deleting a switch port also deletes its peer inside the namespace at once; deleting only
        # the namespace would leave the pair until its last process is gone.
        for link in self._links:
            _run_quietly(["ip", "link", "del", link])
        for namespace in self._namespaces:
            _run_quietly(["ip", "netns", "del", namespace])
        if self._bridge is not None:
            _run_quietly(["ip", "link", "del", self._bridge])
        self._links.clear()
        self._namespaces.clear()
        self._bridge = None

    def __repr__(self) -> str:
        state = "closed" if self._closed else "up" if self._started else "not started"
        return (
            f"EmulatedNetwork(hosts={self.hosts}, rate={format_rate(self.rate_bits)}, "
            f"subnet={self.subnet}, prefix={self.prefix or None!r}, {state})"
        )


def _run(command: list[str]) -> str:
    """Run an ``ip``/``tc`` command; a failure is a ConfigError naming the command and its stderr."""
    try:
        done = subprocess.run(command, check=True, capture_output=True, text=True, timeout=_COMMAND_TIMEOUT_S)
    except subprocess.CalledProcessError as error:
        raise ConfigError(
            f"network setup failed: {shlex.join(command)} exited with {error.returncode}: "
            f"{(error.stderr or '').strip() or '(no message)'}"
        ) from None
    except subprocess.TimeoutExpired:
        raise ConfigError(f"network setup: {shlex.join(command)} ran over {_COMMAND_TIMEOUT_S} s") from None
    except OSError as error:
        raise ConfigError(f"network setup failed: cannot run {shlex.join(command)}: {error}") from None
    return done.stdout


def _run_quietly(command: list[str]) -> None:
    try:
        _run(command)
    except ConfigError as error:
        log.warning("emulated network cleanup: %s", error)


def _kill_processes_in(namespace: str) -> None:
    # A process left inside would keep the namespace (and its veth end) alive after `ip netns del`.
    try:
        pids = _run(["ip", "netns", "pids", namespace]).split()
    except ConfigError as error:
        log.warning("emulated network cleanup: %s", error)
        return
    for pid in pids:
        if int(pid) == os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


@atexit.register
def _close_all() -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
    for network in live:
        network.close()
