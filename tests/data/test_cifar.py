"""CIFAR-10 read from archives the tests write in the official binary format, where it is looked for, and its
verified download from a real HTTP server on loopback."""

from __future__ import annotations

import functools
import hashlib
import http.server
import io
import tarfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from scaletrain.data.cifar import (
    ARCHIVE_NAME,
    ARCHIVE_SHA256,
    BATCHES_FOLDER,
    CLASSES,
    META_FILE,
    RECORD_BYTES,
    TEST_FILE,
    TRAIN_FILES,
    cifar10_location,
    find_cifar10,
    load_cifar10,
)
from scaletrain.data.locate import ENV_CIFAR10_URL, ENV_DATA, ENV_OFFLINE
from scaletrain.errors import DataError

#: Not the official names, so a test can tell that batches.meta.txt was read.
META_NAMES = tuple(f"class-{label}" for label in range(10))
FIX = "-o dataset=fashion-mnist"


def known_image() -> np.ndarray:
    """Red = column, green = 64 + row, blue = 128 + (3·column + 5·row) mod 128: every [c, y, x] is telling."""
    rows, columns = np.mgrid[0:32, 0:32]
    return np.stack([columns, 64 + rows, 128 + (3 * columns + 5 * rows) % 128]).astype(np.uint8)


@dataclass
class Generated:
    files: dict[str, bytes]
    train_images: np.ndarray
    train_labels: list[int]
    test_images: np.ndarray
    test_labels: list[int]


def generate(per_file: int = 2) -> Generated:
    """Six batch files of records in the official layout and a batches.meta.txt; the first training image
    is :func:`known_image`, the others random; the training labels run through all ten classes."""
    rng = np.random.default_rng(0)
    count = per_file * len(TRAIN_FILES)
    train_images = rng.integers(0, 256, (count, 3, 32, 32), dtype=np.uint8)
    train_images[0] = known_image()
    train_labels = [(3 * index + 1) % 10 for index in range(count)]
    test_images = rng.integers(0, 256, (3, 3, 32, 32), dtype=np.uint8)
    test_labels = [9, 0, 5]

    def records(images: np.ndarray, labels: list[int]) -> bytes:
        return b"".join(bytes([label]) + image.tobytes() for image, label in zip(images, labels, strict=True))

    files = {
        name: records(train_images[n * per_file : (n + 1) * per_file], train_labels[n * per_file : (n + 1) * per_file])
        for n, name in enumerate(TRAIN_FILES)
    }
    files[TEST_FILE] = records(test_images, test_labels)
    files[META_FILE] = ("\n".join(META_NAMES) + "\n\n").encode()  # the official file ends with an empty line
    return Generated(files, train_images, train_labels, test_images, test_labels)


def write_archive(path: Path, files: dict[str, bytes]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as archive:
        folder = tarfile.TarInfo(BATCHES_FOLDER)
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, content in files.items():
            info = tarfile.TarInfo(f"{BATCHES_FOLDER}/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path


def write_folder(parent: Path, files: dict[str, bytes]) -> Path:
    folder = parent / BATCHES_FOLDER
    folder.mkdir(parents=True)
    for name, content in files.items():
        (folder / name).write_bytes(content)
    return folder


@pytest.fixture
def data() -> Generated:
    return generate()


# --- Reading -----------------------------------------------------------------------------------------


def test_pixels_come_back_at_channel_row_column(tmp_path: Path, data: Generated) -> None:
    loaded = load_cifar10(write_archive(tmp_path / ARCHIVE_NAME, data.files))
    image = loaded.train_images[0]
    assert int(image[0, 5, 7]) == 7  # red plane: the column
    assert int(image[1, 5, 7]) == 64 + 5  # green plane: 64 + the row
    assert int(image[2, 5, 7]) == 128 + (3 * 7 + 5 * 5) % 128
    assert int(image[0, 31, 0]) == 0 and int(image[1, 31, 0]) == 64 + 31
    assert loaded.train_images.dtype == torch.uint8 and loaded.test_images.dtype == torch.uint8
    assert tuple(loaded.train_images.shape) == (10, 3, 32, 32) and tuple(loaded.test_images.shape) == (3, 3, 32, 32)
    assert np.array_equal(loaded.train_images.numpy(), data.train_images)
    assert np.array_equal(loaded.test_images.numpy(), data.test_images)


def test_labels_in_file_order_and_classes_from_the_meta_file(tmp_path: Path, data: Generated) -> None:
    loaded = load_cifar10(write_archive(tmp_path / ARCHIVE_NAME, data.files))
    assert loaded.train_labels.tolist() == data.train_labels
    assert sorted(set(loaded.train_labels.tolist())) == list(range(10))
    assert loaded.test_labels.tolist() == [9, 0, 5]
    assert loaded.train_labels.dtype == torch.int64 and loaded.test_labels.dtype == torch.int64
    assert loaded.classes == META_NAMES


@pytest.mark.parametrize("where", ["archive", "archive-any-name", "folder-holding-archive", "batches", "parent"])
def test_the_archive_the_unpacked_folder_and_their_parents_read_alike(
    tmp_path: Path, data: Generated, where: str
) -> None:
    path = {
        "archive": lambda: write_archive(tmp_path / ARCHIVE_NAME, data.files),
        "archive-any-name": lambda: write_archive(tmp_path / "download.bin", data.files),
        "folder-holding-archive": lambda: write_archive(tmp_path / ARCHIVE_NAME, data.files).parent,
        "batches": lambda: write_folder(tmp_path, data.files),
        "parent": lambda: write_folder(tmp_path, data.files).parent,
    }[where]()
    loaded = load_cifar10(path)
    assert np.array_equal(loaded.train_images.numpy(), data.train_images)
    assert np.array_equal(loaded.test_images.numpy(), data.test_images)
    assert loaded.train_labels.tolist() == data.train_labels and loaded.classes == META_NAMES


def test_an_unpacked_folder_without_the_meta_file_gets_the_official_names(tmp_path: Path, data: Generated) -> None:
    del data.files[META_FILE]
    assert load_cifar10(write_folder(tmp_path, data.files)).classes == CLASSES


def test_a_complete_unpacked_folder_wins_over_the_archive_beside_it(tmp_path: Path, data: Generated) -> None:
    archive = write_archive(tmp_path / ARCHIVE_NAME, data.files)
    assert cifar10_location(tmp_path) == archive
    folder = write_folder(tmp_path, data.files)
    assert cifar10_location(tmp_path) == folder
    (folder / TRAIN_FILES[1]).unlink()  # a half-unpacked folder does not count
    assert cifar10_location(tmp_path) == archive


# --- Damage ------------------------------------------------------------------------------------------


def _truncate(files: dict[str, bytes]) -> None:
    files[TRAIN_FILES[2]] = files[TRAIN_FILES[2]][:-5]


def _label_ten(files: dict[str, bytes]) -> None:
    files[TEST_FILE] = files[TEST_FILE][:RECORD_BYTES] + bytes([10]) + files[TEST_FILE][RECORD_BYTES + 1 :]


def _drop_test(files: dict[str, bytes]) -> None:
    del files[TEST_FILE]


def _nine_names(files: dict[str, bytes]) -> None:
    files[META_FILE] = "\n".join(META_NAMES[:9]).encode()


@pytest.mark.parametrize("form", ["archive", "folder"])
@pytest.mark.parametrize(
    ("damage", "culprit", "problem"),
    [
        (_truncate, "data_batch_3.bin", f"{2 * RECORD_BYTES - 5} bytes is not a whole"),
        (_label_ten, TEST_FILE, "record 1 has label 10, outside 0–9"),
        (_drop_test, TEST_FILE, "lacks|missing"),
        (_nine_names, META_FILE, "9 class names where CIFAR-10 has 10"),
    ],
    ids=["truncated-record", "label-10", "missing-test-batch", "nine-class-names"],
)
def test_damage_is_one_error_naming_the_file_and_the_fix(
    tmp_path: Path,
    data: Generated,
    form: str,
    damage: Callable[[dict[str, bytes]], None],
    culprit: str,
    problem: str,
) -> None:
    damage(data.files)
    if form == "archive":
        path = write_archive(tmp_path / ARCHIVE_NAME, data.files)
    else:
        path = write_folder(tmp_path, data.files).parent
    with pytest.raises(DataError, match=problem) as error:
        load_cifar10(path)
    message = str(error.value)
    assert culprit in message and str(tmp_path) in message
    assert f"fresh copy of {ARCHIVE_NAME}" in message and FIX in message


@pytest.mark.parametrize(
    ("spoil", "problem"),
    [
        (lambda raw: b"<html><body>404 Not Found</body></html>", "not a gzip file"),
        (lambda raw: raw[: len(raw) // 2], "ended before the end-of-stream marker"),
        (lambda raw: raw[:-4], "ended before the end-of-stream marker"),  # only the length trailer is cut
        (lambda raw: raw[:-8] + bytes(byte ^ 0xFF for byte in raw[-8:-4]) + raw[-4:], "CRC check failed"),
    ],
    ids=["html-page", "cut-in-half", "cut-trailer", "bad-crc"],
)
def test_an_archive_that_is_no_good_gzip_is_an_error(
    tmp_path: Path, data: Generated, spoil: Callable[[bytes], bytes], problem: str
) -> None:
    archive = write_archive(tmp_path / ARCHIVE_NAME, data.files)
    archive.write_bytes(spoil(archive.read_bytes()))
    with pytest.raises(DataError, match=problem) as error:
        load_cifar10(archive)
    message = str(error.value)
    assert message.startswith(f"{archive}: not a readable gzip-compressed tar archive")
    assert ARCHIVE_SHA256 in message and FIX in message


def test_a_folder_without_cifar_says_what_it_needs(tmp_path: Path, data: Generated) -> None:
    with pytest.raises(DataError, match=f"neither {ARCHIVE_NAME} nor a {BATCHES_FOLDER} folder"):
        load_cifar10(tmp_path)
    with pytest.raises(DataError, match="no such file or folder"):
        load_cifar10(tmp_path / "absent")
    folder = write_folder(tmp_path, data.files)
    (folder / TRAIN_FILES[0]).unlink()
    with pytest.raises(DataError, match=f"{BATCHES_FOLDER}: CIFAR-10 files missing: data_batch_1.bin;"):
        load_cifar10(tmp_path)


# --- Where it is looked for --------------------------------------------------------------------------


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """An environment with its own empty cache, so the user's real cache and variables never leak in."""
    return {"XDG_CACHE_HOME": str(tmp_path / "xdg")}


def test_data_dir_wins_and_then_only_there(tmp_path: Path, data: Generated, environ: dict[str, str]) -> None:
    cached = write_archive(tmp_path / "xdg" / "scaletrain" / "cifar-10" / ARCHIVE_NAME, data.files)
    shared = write_archive(tmp_path / "shared" / ARCHIVE_NAME, data.files)
    environ[ENV_DATA] = str(shared.parent)
    mine = write_archive(tmp_path / "mine" / ARCHIVE_NAME, data.files)
    assert find_cifar10(mine.parent, environ=environ, system_dirs=[cached.parent]) == mine
    nested = write_folder(tmp_path / "nested" / "cifar-10", data.files)
    assert find_cifar10(tmp_path / "nested", environ=environ) == nested
    assert find_cifar10(nested, environ=environ) == nested  # the batches folder itself

    (tmp_path / "half").mkdir()
    (tmp_path / "half" / TRAIN_FILES[0]).write_bytes(data.files[TRAIN_FILES[0]])
    with pytest.raises(DataError) as error:
        find_cifar10(tmp_path / "half", environ=environ)  # the cache and $SCALETRAIN_DATA hold it: not used
    message = str(error.value)
    assert f"--data-dir {tmp_path / 'half'}: no CIFAR-10 there" in message
    assert f"{tmp_path / 'half'} lacks data_batch_2.bin" in message and str(tmp_path / "half" / "cifar-10") in message
    assert "or leave out --data-dir" in message and FIX in message


def test_environment_then_system_dirs_then_cache(tmp_path: Path, data: Generated, environ: dict[str, str]) -> None:
    cached = write_archive(tmp_path / "xdg" / "scaletrain" / "cifar-10" / ARCHIVE_NAME, data.files)
    assert find_cifar10(None, environ=environ, download=False) == cached
    system = write_folder(tmp_path / "system", data.files)
    assert find_cifar10(None, environ=environ, system_dirs=[tmp_path / "none", tmp_path / "system"]) == system
    environ[ENV_DATA] = str(tmp_path / "shared")
    assert find_cifar10(None, environ=environ, system_dirs=[tmp_path / "system"]) == system  # shared is empty
    in_subfolder = write_archive(tmp_path / "shared" / "cifar-10" / ARCHIVE_NAME, data.files)
    assert find_cifar10(None, environ=environ, system_dirs=[tmp_path / "system"]) == in_subfolder
    direct = write_archive(tmp_path / "shared" / ARCHIVE_NAME, data.files)
    assert find_cifar10(None, environ=environ, system_dirs=[tmp_path / "system"]) == direct


# --- Download ----------------------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[str]

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.requests.append(self.path)
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
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield Server(f"http://127.0.0.1:{httpd.server_address[1]}/{ARCHIVE_NAME}", root, requests)
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize(
    ("download", "offline", "reason"),
    [(False, "", "downloading was not allowed"), (True, "1", f"downloading was skipped because {ENV_OFFLINE}=1")],
)
def test_offline_and_no_download_fetch_nothing_and_say_so(
    tmp_path: Path, data: Generated, environ: dict[str, str], server: Server, download: bool, offline: str, reason: str
) -> None:
    write_archive(server.root / ARCHIVE_NAME, data.files)
    environ.update({ENV_DATA: str(tmp_path / "shared"), ENV_OFFLINE: offline, ENV_CIFAR10_URL: server.url})
    with pytest.raises(DataError) as error:
        find_cifar10(None, download=download, environ=environ, system_dirs=[tmp_path / "system"])
    message = str(error.value)
    places = [tmp_path / "shared", tmp_path / "shared" / "cifar-10", tmp_path / "system"]
    places.append(tmp_path / "xdg" / "scaletrain" / "cifar-10")
    assert f"searched {', '.join(map(str, places))}; {reason}." in message
    assert "--data-dir" in message and "go online" in message and FIX in message
    assert server.requests == [] and not (tmp_path / "xdg").exists()


def test_download_lands_verified_in_the_cache(data: Generated, environ: dict[str, str], server: Server) -> None:
    served = write_archive(server.root / ARCHIVE_NAME, data.files)
    digest = hashlib.sha256(served.read_bytes()).hexdigest()
    environ[ENV_CIFAR10_URL] = server.url
    found = find_cifar10(None, environ=environ, sha256=digest)
    assert found == Path(environ["XDG_CACHE_HOME"]) / "scaletrain" / "cifar-10" / ARCHIVE_NAME
    assert found.read_bytes() == served.read_bytes() and server.requests == [f"/{ARCHIVE_NAME}"]
    assert sorted(path.name for path in found.parent.iterdir()) == [ARCHIVE_NAME]
    assert load_cifar10(found).test_labels.tolist() == data.test_labels
    assert find_cifar10(None, environ=environ, sha256=digest) == found and len(server.requests) == 1  # cached


@pytest.mark.parametrize("sha256", ["0" * 64, None], ids=["given", "official-default"])
def test_a_checksum_mismatch_leaves_nothing_at_the_destination(
    data: Generated, environ: dict[str, str], server: Server, sha256: str | None
) -> None:
    write_archive(server.root / ARCHIVE_NAME, data.files)
    environ[ENV_CIFAR10_URL] = server.url
    with pytest.raises(DataError) as error:
        find_cifar10(None, environ=environ, sha256=sha256)
    message = str(error.value)
    assert "download failed: checksum mismatch" in message and server.url in message
    assert ("0" * 64 if sha256 else ARCHIVE_SHA256) in message  # None means the official archive's digest
    assert FIX in message and len(server.requests) == 1
    cache = Path(environ["XDG_CACHE_HOME"]) / "scaletrain" / "cifar-10"
    assert list(cache.iterdir()) == []  # neither the archive nor a partial file
