"""Verified downloads against a real HTTP server on loopback, and the Fashion-MNIST download fallback."""

from __future__ import annotations

import errno
import functools
import hashlib
import http.server
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

import numpy as np
import pytest

import scaletrain.data.download as download_module
from scaletrain.data.download import download, file_sha256
from scaletrain.data.idx import find_fashion_mnist, load_fashion_mnist, write_idx
from scaletrain.data.locate import ENV_FASHION_MNIST_URL, ENV_OFFLINE
from scaletrain.errors import DataError

PAYLOAD = bytes(range(256)) * 5000  # 1.28 MB: more than one 1 MiB read, so streaming is exercised
PAYLOAD_SHA256 = hashlib.sha256(PAYLOAD).hexdigest()


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
        if self.path == "/short":
            # Promise more than is sent, then hang up: the client sees a broken-off transfer.
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            self.wfile.write(b"x" * 10)
            self.close_connection = True
            return
        super().do_GET()


@dataclass
class Server:
    url: str
    root: Path
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    root = tmp_path / "served"
    root.mkdir()
    requests: list[str] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(root)))
    # A short poll interval keeps shutdown(), and so each test's teardown, fast.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}/", root, requests)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.fixture
def destination(tmp_path: Path) -> Path:
    folder = tmp_path / "downloads"
    folder.mkdir()
    return folder / "file.bin"


def _left_in(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir())


def test_good_download_is_verified_and_placed(server: Server, destination: Path) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD)
    assert download(server.url + "file.bin", destination, PAYLOAD_SHA256) == destination
    assert destination.read_bytes() == PAYLOAD
    assert _left_in(destination.parent) == ["file.bin"]


def test_uppercase_checksum_is_accepted(server: Server, destination: Path) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD)
    download(server.url + "file.bin", destination, PAYLOAD_SHA256.upper())
    assert file_sha256(destination) == PAYLOAD_SHA256


def test_missing_folders_are_created(server: Server, tmp_path: Path) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD)
    target = tmp_path / "a" / "b" / "file.bin"
    download(server.url + "file.bin", target, PAYLOAD_SHA256)
    assert target.read_bytes() == PAYLOAD


def test_existing_good_file_is_not_fetched_again(server: Server, destination: Path) -> None:
    destination.write_bytes(PAYLOAD)
    assert download(server.url + "file.bin", destination, PAYLOAD_SHA256) == destination
    assert server.requests == []


def test_existing_wrong_file_is_replaced(server: Server, destination: Path) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD)
    destination.write_bytes(b"stale")
    download(server.url + "file.bin", destination, PAYLOAD_SHA256)
    assert destination.read_bytes() == PAYLOAD
    assert _left_in(destination.parent) == ["file.bin"]


def test_checksum_mismatch_leaves_nothing(server: Server, destination: Path) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD + b"!")
    url = server.url + "file.bin"
    with pytest.raises(DataError) as error:
        download(url, destination, PAYLOAD_SHA256)
    message = str(error.value)
    assert "checksum mismatch" in message
    assert PAYLOAD_SHA256 in message
    assert hashlib.sha256(PAYLOAD + b"!").hexdigest() in message
    assert url in message
    assert _left_in(destination.parent) == []


def test_checksum_mismatch_keeps_the_previous_file_untouched(server: Server, destination: Path) -> None:
    (server.root / "file.bin").write_bytes(b"wrong")
    destination.write_bytes(b"previous")
    with pytest.raises(DataError, match="checksum mismatch"):
        download(server.url + "file.bin", destination, PAYLOAD_SHA256)
    assert destination.read_bytes() == b"previous"
    assert _left_in(destination.parent) == ["file.bin"]


def test_http_404_leaves_nothing(server: Server, destination: Path) -> None:
    with pytest.raises(DataError, match="HTTP 404") as error:
        download(server.url + "absent.bin", destination, PAYLOAD_SHA256)
    assert "by hand" in str(error.value)
    assert str(destination) in str(error.value)
    assert _left_in(destination.parent) == []


def test_broken_off_transfer_leaves_nothing(server: Server, destination: Path) -> None:
    with pytest.raises(DataError, match="broke off after 10 of 100000 bytes"):
        download(server.url + "short", destination, PAYLOAD_SHA256)
    assert _left_in(destination.parent) == []


def test_connection_refused(destination: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port any more, so the connection is refused.
    with pytest.raises(DataError, match="failed"):
        download(f"http://127.0.0.1:{port}/file.bin", destination, PAYLOAD_SHA256, timeout=5)
    assert _left_in(destination.parent) == []


def test_server_that_never_answers_times_out(destination: Path) -> None:
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel completes the handshake, but nobody ever reads or replies
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/file.bin"
        with pytest.raises(DataError, match="failed"):
            download(url, destination, PAYLOAD_SHA256, timeout=0.3)
    assert _left_in(destination.parent) == []


def test_full_disk_leaves_nothing(server: Server, destination: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (server.root / "file.bin").write_bytes(PAYLOAD)

    def copy_until_full(source: BinaryIO, target: BinaryIO) -> tuple[str, int]:
        target.write(source.read(1000))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download_module, "_copy", copy_until_full)
    with pytest.raises(DataError, match="no space left"):
        download(server.url + "file.bin", destination, PAYLOAD_SHA256)
    assert _left_in(destination.parent) == []


def test_not_a_url(destination: Path) -> None:
    with pytest.raises(DataError, match="http://"):
        download("no-scheme/file.bin", destination, PAYLOAD_SHA256)
    assert _left_in(destination.parent) == []


def test_malformed_checksum_is_a_programming_error(destination: Path) -> None:
    with pytest.raises(ValueError, match="64 hexadecimal"):
        download("http://127.0.0.1/x", destination, "abc")


# --- find_fashion_mnist falling through to the download ---------------------------------------------


def _serve_fashion(root: Path, *, train: int = 50, test: int = 20) -> dict[str, str]:
    rng = np.random.default_rng(0)
    checksums = {}
    for prefix, count in (("train", train), ("t10k", test)):
        for kind, array in (
            ("images-idx3", rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)),
            ("labels-idx1", rng.integers(0, 10, size=count, dtype=np.uint8)),
        ):
            name = f"{prefix}-{kind}-ubyte.gz"
            write_idx(root / name, array)
            checksums[name] = file_sha256(root / name)
    return checksums


def test_find_fashion_mnist_downloads_into_the_cache(server: Server, tmp_path: Path) -> None:
    checksums = _serve_fashion(server.root)
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache"), ENV_FASHION_MNIST_URL: server.url}
    found = find_fashion_mnist(None, environ=environ, system_dirs=[], checksums=checksums)
    assert found == tmp_path / "cache" / "scaletrain" / "fashion-mnist"
    assert sorted(server.requests) == sorted(f"/{name}" for name in checksums)
    assert _left_in(found) == sorted(checksums)
    assert load_fashion_mnist(found).train_images.shape == (50, 1, 28, 28)

    # The second search finds the cache and, even offline, fetches nothing.
    server.requests.clear()
    again = find_fashion_mnist(None, environ={**environ, ENV_OFFLINE: "1"}, system_dirs=[], checksums=checksums)
    assert again == found
    assert server.requests == []


def test_failed_fashion_download_names_the_fixes_and_leaves_no_partial_file(server: Server, tmp_path: Path) -> None:
    checksums = _serve_fashion(server.root)
    checksums["t10k-images-idx3-ubyte.gz"] = "0" * 64
    environ = {"XDG_CACHE_HOME": str(tmp_path / "cache"), ENV_FASHION_MNIST_URL: server.url.rstrip("/")}
    with pytest.raises(DataError) as error:
        find_fashion_mnist(None, environ=environ, system_dirs=[tmp_path / "system"], checksums=checksums)
    message = str(error.value)
    assert "checksum mismatch" in message
    assert str(tmp_path / "system") in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data-dir" in message
    cache = tmp_path / "cache" / "scaletrain" / "fashion-mnist"
    # Files verified before the failure may stay (they are complete); the bad one must not.
    assert "t10k-images-idx3-ubyte.gz" not in _left_in(cache)
    assert all(not name.startswith(".") for name in _left_in(cache))


def test_offline_means_no_download(server: Server, tmp_path: Path) -> None:
    checksums = _serve_fashion(server.root)
    environ = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        ENV_FASHION_MNIST_URL: server.url,
        ENV_OFFLINE: "1",
    }
    with pytest.raises(DataError, match="SCALETRAIN_OFFLINE=1"):
        find_fashion_mnist(None, environ=environ, system_dirs=[], checksums=checksums)
    assert server.requests == []
    assert not (tmp_path / "cache").exists()
