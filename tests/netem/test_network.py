"""Emulated networks: rates, real TCP throughput through tbf, cleanup, and gloo across namespaces.

The tests that build namespaces need root and iproute2; they are skipped, with the reason, where
those are missing. Rate parsing and the non-root refusal run everywhere.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from scaletrain.errors import ConfigError
from scaletrain.netem import EmulatedNetwork, format_rate, parse_rate
from scaletrain.netem import network as network_module


def _netns_unusable() -> str | None:
    """Why namespaces with tc cannot be built here, or None when they can."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces and tc qdiscs"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"needs the '{tool}' command (iproute2)"
    probe = f"stprobe{os.getpid()}"
    try:
        added = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"'ip netns add' unusable: {error}"
    if added.returncode != 0:
        return f"'ip netns add' unusable: {added.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=10)
    return None


_UNUSABLE = _netns_unusable()
needs_netns = pytest.mark.skipif(_UNUSABLE is not None, reason=f"emulated network: {_UNUSABLE}")

MBIT = 1_000_000
PORT = 5001  # every namespace is new, so any port is free in it

# Receives until EOF and prints the byte count and the seconds from the first byte to EOF, which
# leaves process start-up and the TCP handshake out of the throughput.
SERVER = textwrap.dedent(
    """
    import socket, sys, time
    server = socket.socket()
    server.bind((sys.argv[1], int(sys.argv[2])))
    server.listen(1)
    print("ready", flush=True)
    conn, _ = server.accept()
    received, first, buf = 0, None, bytearray(1 << 20)
    while (got := conn.recv_into(buf)):
        first = first or time.perf_counter()
        received += got
    print(received, time.perf_counter() - first, flush=True)
    """
)
CLIENT = textwrap.dedent(
    """
    import socket, sys
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
    left, chunk = int(sys.argv[3]), b"x" * (1 << 20)
    while left > 0:
        conn.sendall(chunk[:left])
        left -= len(chunk)
    conn.shutdown(socket.SHUT_WR)
    conn.recv(1)
    """
)


def _throughput(net: EmulatedNetwork, nbytes: int, *, src: int = 1, dst: int = 0) -> float:
    """Bits per second of one TCP transfer of ``nbytes`` from host ``src`` to host ``dst``."""
    server = subprocess.Popen(
        [*net.command_prefix(dst), sys.executable, "-c", SERVER, net.address(dst), str(PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        assert server.stdout.readline().strip() == "ready"
        client = [sys.executable, "-c", CLIENT, net.address(dst), str(PORT), str(nbytes)]
        subprocess.run([*net.command_prefix(src), *client], check=True, timeout=60)
        received, seconds = server.stdout.readline().split()
        assert server.wait(timeout=10) == 0
    finally:
        server.kill()
        server.wait()
    assert int(received) == nbytes
    return int(received) * 8 / float(seconds)


def _root_names() -> tuple[set[str], str]:
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split()[0] for line in namespaces.splitlines() if line.strip()}, links


def _assert_gone(namespaces: list[str], links: list[str]) -> None:
    present_namespaces, present_links = _root_names()
    assert not set(namespaces) & present_namespaces
    for link in links:
        assert f" {link}:" not in present_links and f" {link}@" not in present_links


def _wait_until_inside(namespace: str, pid: int) -> None:
    """Wait until `ip netns exec` has moved ``pid`` into ``namespace`` (it starts in the root one)."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        pids = subprocess.run(["ip", "netns", "pids", namespace], capture_output=True, text=True).stdout
        if str(pid) in pids.split():
            return
        time.sleep(0.02)
    pytest.fail(f"process {pid} never appeared in namespace {namespace}")


def _names(net: EmulatedNetwork) -> tuple[list[str], list[str]]:
    namespaces = [net.namespace(i) for i in range(net.hosts)]
    return namespaces, [net.bridge] + [f"{net.prefix}h{i}" for i in range(net.hosts)]


@pytest.fixture(scope="module")
def net50():
    """Two hosts at 50 Mbit/s, shared by the throughput and gloo tests to save set-up time."""
    if _UNUSABLE is not None:
        pytest.skip(f"emulated network: {_UNUSABLE}")
    with EmulatedNetwork(2, 50 * MBIT) as net:
        yield net


# -- rates ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "bits"),
    [
        ("1gbit", 10**9),
        ("100mbit", 100 * MBIT),
        ("10Mbit", 10 * MBIT),
        ("500kbit", 500_000),
        ("2.5gbit", 2_500_000_000),
        ("1000000", 1_000_000),
        (" 64 KBIT ", 64_000),
        ("1200bit", 1200),
        ("1tbit", 10**12),
    ],
)
def test_parse_rate(text: str, bits: int) -> None:
    assert parse_rate(text) == bits


@pytest.mark.parametrize("text", ["", "fast", "10mbps", "10MB", "-5mbit", "1e9", "mbit", "0", "0.1", "10 m"])
def test_parse_rate_refuses_with_the_accepted_forms(text: str) -> None:
    with pytest.raises(ConfigError, match="100mbit"):
        parse_rate(text)


@pytest.mark.parametrize(
    ("bits", "text"),
    [(MBIT, "1mbit"), (10**9, "1gbit"), (2500 * MBIT, "2500mbit"), (500000, "500kbit"), (7, "7bit")],
)
def test_format_rate_round_trips(bits: int, text: str) -> None:
    assert format_rate(bits) == text
    assert parse_rate(text) == bits


def test_bad_arguments_are_refused_before_touching_the_system() -> None:
    with pytest.raises(ConfigError, match="at least one host"):
        EmulatedNetwork(0, MBIT)
    with pytest.raises(ConfigError, match="minimum"):
        EmulatedNetwork(2, 10)
    with pytest.raises(ConfigError, match="no room"):
        EmulatedNetwork(5, MBIT, subnet="10.1.0.0/30")
    with pytest.raises(ConfigError, match="IPv4 network"):
        EmulatedNetwork(2, MBIT, subnet="not-a-subnet")
    with pytest.raises(ConfigError, match="too long"):
        EmulatedNetwork(2, MBIT, prefix="a-very-long-prefix")


def test_addresses_follow_the_subnet() -> None:
    net = EmulatedNetwork(3, MBIT, subnet="192.168.7.0/24")
    assert [net.address(i) for i in range(3)] == ["192.168.7.1", "192.168.7.2", "192.168.7.3"]
    with pytest.raises(IndexError):
        net.address(3)


# -- refusals without root or iproute2 -----------------------------------------------------------------------


def test_non_root_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ConfigError, match=r"--network needs root .*drop --network"), EmulatedNetwork(2, MBIT):
        pytest.fail("the body must not run")


def test_missing_iproute2_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(network_module.shutil, "which", lambda tool: None)
    with pytest.raises(ConfigError, match="iproute2"), EmulatedNetwork(2, MBIT):
        pytest.fail("the body must not run")


# -- real namespaces -----------------------------------------------------------------------------------------


@pytest.mark.alone  #
@needs_netns
def test_tcp_throughput_follows_the_rate(net50: EmulatedNetwork) -> None:
    # ~1 s at 50 Mbit/s. TCP goodput is ~95.6 % of the link rate tbf enforces (1448 payload bytes
    # in every 1514-byte frame), well inside the ±20 %.
    slow = _throughput(net50, 6_000_000)
    assert 0.8 * 50 * MBIT <= slow <= 1.2 * 50 * MBIT, f"{slow / MBIT:.1f} Mbit/s at 50mbit"
    with EmulatedNetwork(2, 200 * MBIT) as fast_net:
        fast = _throughput(fast_net, 6_000_000)
    assert fast / slow > 2.5, f"200mbit gave {fast / MBIT:.1f} Mbit/s, 50mbit gave {slow / MBIT:.1f}"


@needs_netns
def test_hosts_reach_each_other_only_through_their_interface(net50: EmulatedNetwork) -> None:
    shown = subprocess.run(
        [*net50.command_prefix(1), "ip", "-o", "-4", "addr"], capture_output=True, text=True, check=True
    ).stdout
    assert f"{net50.address(1)}/24" in shown and net50.interface(1) in shown and "127.0.0.1" in shown
    qdisc = subprocess.run(
        ["tc", "-n", net50.namespace(1), "qdisc", "show", "dev", net50.interface(1)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "tbf" in qdisc and "50Mbit" in qdisc
    assert net50.environment(1) == {"GLOO_SOCKET_IFNAME": net50.interface(1)}
    assert net50.command_prefix(1) == ["ip", "netns", "exec", net50.namespace(1)]


@needs_netns
def test_everything_is_deleted_on_exit_and_processes_are_killed() -> None:
    with EmulatedNetwork(2, 100 * MBIT) as net:
        namespaces, links = _names(net)
        assert set(namespaces) <= _root_names()[0]
        sleeper = subprocess.Popen([*net.command_prefix(0), "sleep", "60"])
        _wait_until_inside(net.namespace(0), sleeper.pid)
    assert sleeper.wait(timeout=10) == -9
    _assert_gone(namespaces, links)
    net.close()  # idempotent


@needs_netns
def test_everything_is_deleted_when_the_body_raises() -> None:
    with pytest.raises(RuntimeError, match="boom"), EmulatedNetwork(3, 10 * MBIT) as net:
        namespaces, links = _names(net)
        raise RuntimeError("boom")
    _assert_gone(namespaces, links)


@needs_netns
def test_half_built_network_is_removed_and_foreign_names_are_left_alone() -> None:
    prefix = f"stt{os.getpid() % 100000}"
    foreign = f"{prefix}n1"  # the namespace host 1 would get: creation fails there
    subprocess.run(["ip", "netns", "add", foreign], check=True, capture_output=True)
    try:
        net = EmulatedNetwork(2, 10 * MBIT, prefix=prefix)
        with pytest.raises(ConfigError, match=rf"ip netns add {foreign}"), net:
            pytest.fail("the body must not run")
        _assert_gone([f"{prefix}n0"], [f"{prefix}br", f"{prefix}h0", f"{prefix}h1"])
        assert foreign in _root_names()[0]
    finally:
        subprocess.run(["ip", "netns", "del", foreign], capture_output=True)


GLOO_SCRIPT = textwrap.dedent(
    """
    import os
    from datetime import timedelta
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=timedelta(seconds=30))
    tensor = torch.full((4,), float(rank + 1))
    dist.all_reduce(tensor)
    print("RESULT", rank, tensor.tolist(), flush=True)
    dist.destroy_process_group()
    """
)


@needs_netns
@pytest.mark.multiprocess
def test_gloo_all_reduce_across_namespaces(net50: EmulatedNetwork, tmp_path: Path) -> None:
    script = tmp_path / "allreduce.py"
    script.write_text(GLOO_SCRIPT, encoding="utf-8")
    port = str(random.randint(29000, 29999))
    processes = []
    for rank in range(2):
        env = {
            **os.environ,
            **net50.environment(rank),
            "MASTER_ADDR": net50.address(0),
            "MASTER_PORT": port,
            "RANK": str(rank),
            "WORLD_SIZE": "2",
        }
        processes.append(
            subprocess.Popen(
                [*net50.command_prefix(rank), sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    try:
        outputs = [process.communicate(timeout=60)[0] for process in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()
    for rank, (process, output) in enumerate(zip(processes, outputs, strict=True)):
        assert process.returncode == 0, output
        assert f"RESULT {rank} [3.0, 3.0, 3.0, 3.0]" in output, output
