"""IDX reading/writing and Fashion-MNIST loading, on small generated files."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from scaletrain.data.idx import (
    FASHION_MNIST_MEAN,
    FASHION_MNIST_STD,
    load_fashion_mnist,
    read_idx,
    write_idx,
)
from scaletrain.errors import DataError

REAL_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")


def write_fashion(folder: Path, train: int = 50, test: int = 20, suffix: str = ".gz", seed: int = 0) -> None:
    """Write a small, random but valid Fashion-MNIST into ``folder``."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, count in (("train", train), ("t10k", test)):
        images = rng.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=count, dtype=np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte{suffix}", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels)


def header(type_code: int, *sizes: int) -> bytes:
    return bytes([0, 0, type_code, len(sizes)]) + np.asarray(sizes, dtype=">u4").tobytes()


# --- read_idx / write_idx -------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a-idx3-ubyte", "a-idx3-ubyte.gz"])
@pytest.mark.parametrize("shape", [(7,), (3, 4), (2, 28, 28), (1, 2, 3, 4)])
def test_round_trip(tmp_path: Path, name: str, shape: tuple[int, ...]) -> None:
    array = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    path = tmp_path / name
    write_idx(path, array)
    result = read_idx(path)
    assert result.dtype == np.uint8
    assert np.array_equal(result, array)
    assert result.flags.writeable
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_written_file_is_big_endian_idx(tmp_path: Path) -> None:
    write_idx(tmp_path / "x", np.arange(6, dtype=np.uint8).reshape(2, 3))
    assert (tmp_path / "x").read_bytes() == header(0x08, 2, 3) + bytes(range(6))


def test_gz_suffix_writes_gzip_and_gzip_is_recognised_by_content(tmp_path: Path) -> None:
    write_idx(tmp_path / "x.gz", np.arange(4, dtype=np.uint8))
    raw = gzip.decompress((tmp_path / "x.gz").read_bytes())
    assert raw == header(0x08, 4) + bytes(range(4))
    renamed = tmp_path / "x-without-suffix"
    (tmp_path / "x.gz").rename(renamed)
    assert read_idx(renamed).tolist() == [0, 1, 2, 3]


def test_missing_file_says_how_to_get_the_data(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="not found") as error:
        read_idx(tmp_path / "nope-idx1-ubyte")
    assert "nope-idx1-ubyte" in str(error.value)
    assert "apt-get install dataset-fashion-mnist" in str(error.value)
    assert "--data-dir" in str(error.value)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "too short"),
        (b"\x00\x00\x08", "too short"),
        (b"\x01\x00\x08\x01" + bytes(8), "not an IDX file"),
        (b"\x00\x01\x08\x01" + bytes(8), "not an IDX file"),
        (b"\x00\x00\x07\x01" + bytes(8), "not an IDX file"),
        (b"PK\x03\x04 zip file", "not an IDX file"),
        (header(0x0D, 2) + bytes(8), "float32 is not supported"),
        (b"\x00\x00\x08\x00", "zero dimensions"),
        (b"\x00\x00\x08\x03" + bytes(8), "too short for an IDX header of 3 dimensions"),
        (header(0x08, 2, 3) + bytes(5), "truncated"),
        (header(0x08, 2, 3) + bytes(7), "1 unexpected bytes"),
    ],
)
def test_bad_raw_files(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as error:
        read_idx(path)
    assert str(path) in str(error.value)


def test_truncated_data_inside_valid_gzip(tmp_path: Path) -> None:
    path = tmp_path / "short.gz"
    path.write_bytes(gzip.compress(header(0x08, 10, 28, 28) + bytes(28 * 28 * 9)))
    with pytest.raises(DataError, match="truncated"):
        read_idx(path)


def test_truncated_gzip(tmp_path: Path) -> None:
    path = tmp_path / "cut.gz"
    write_idx(path, np.random.default_rng(2).integers(0, 256, size=(20, 28, 28), dtype=np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_idx(path)


@pytest.mark.parametrize("position", [3, 40, -6])
def test_corrupt_gzip(tmp_path: Path, position: int) -> None:
    path = tmp_path / "bad.gz"
    write_idx(path, np.random.default_rng(3).integers(0, 256, size=(20, 28, 28), dtype=np.uint8))
    content = bytearray(path.read_bytes())
    content[position] ^= 0xFF
    path.write_bytes(bytes(content))
    with pytest.raises(DataError, match="corrupt or truncated gzip"):
        read_idx(path)


def test_write_rejects_other_dtypes_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="astype"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.float32))
    with pytest.raises(DataError, match="0-dimensional"):
        write_idx(tmp_path / "x", np.uint8(3))
    assert list(tmp_path.iterdir()) == []


def test_write_into_missing_folder_fails_cleanly(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="cannot write"):
        write_idx(tmp_path / "missing" / "x", np.zeros(3, dtype=np.uint8))
    assert list(tmp_path.iterdir()) == []


# --- load_fashion_mnist -------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_load_small_fashion_mnist(tmp_path: Path, suffix: str) -> None:
    write_fashion(tmp_path, train=50, test=20, suffix=suffix)
    data = load_fashion_mnist(tmp_path)
    assert data.train_images.shape == (50, 1, 28, 28)
    assert data.test_images.shape == (20, 1, 28, 28)
    assert data.train_images.dtype == torch.float32
    assert data.train_labels.dtype == torch.int64
    assert data.train_labels.shape == (50,)
    raw_images = read_idx(tmp_path / f"train-images-idx3-ubyte{suffix}")
    raw_labels = read_idx(tmp_path / f"t10k-labels-idx1-ubyte{suffix}")
    expected = (raw_images.astype(np.float64) / 255 - FASHION_MNIST_MEAN) / FASHION_MNIST_STD
    assert np.allclose(data.train_images[:, 0].numpy(), expected, atol=1e-5)
    assert data.test_labels.tolist() == raw_labels.tolist()


def test_black_and_white_pixels_normalise_to_known_values(tmp_path: Path) -> None:
    write_fashion(tmp_path, train=2, test=2)
    images = np.zeros((2, 28, 28), dtype=np.uint8)
    images[1] = 255
    write_idx(tmp_path / "train-images-idx3-ubyte.gz", images)
    data = load_fashion_mnist(tmp_path)
    assert data.train_images[0].unique().tolist() == pytest.approx([-0.2860 / 0.3530])
    assert data.train_images[1].unique().tolist() == pytest.approx([(1 - 0.2860) / 0.3530])


def test_gz_is_preferred_over_raw(tmp_path: Path) -> None:
    write_fashion(tmp_path, train=5, test=3, suffix=".gz")
    write_idx(tmp_path / "train-labels-idx1-ubyte", np.full(5, 9, dtype=np.uint8))
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.full(5, 4, dtype=np.uint8))
    assert load_fashion_mnist(tmp_path).train_labels.tolist() == [4] * 5


def test_mixed_gz_and_raw_files(tmp_path: Path) -> None:
    write_fashion(tmp_path, train=5, test=3, suffix=".gz")
    gz = tmp_path / "t10k-images-idx3-ubyte.gz"
    (tmp_path / "t10k-images-idx3-ubyte").write_bytes(gzip.decompress(gz.read_bytes()))
    gz.unlink()
    assert load_fashion_mnist(tmp_path).test_images.shape == (3, 1, 28, 28)


def test_missing_file_is_named_with_the_fixes(tmp_path: Path) -> None:
    write_fashion(tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as error:
        load_fashion_mnist(tmp_path)
    message = str(error.value)
    assert "t10k-labels-idx1-ubyte.gz" in message
    assert "train-images" not in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data-dir" in message


def test_count_mismatch_names_both_files_and_counts(tmp_path: Path) -> None:
    write_fashion(tmp_path, train=50, test=20)
    write_idx(tmp_path / "train-labels-idx1-ubyte.gz", np.zeros(49, dtype=np.uint8))
    with pytest.raises(DataError) as error:
        load_fashion_mnist(tmp_path)
    message = str(error.value)
    assert "train-images-idx3-ubyte.gz holds 50 images" in message
    assert "train-labels-idx1-ubyte.gz holds 49 labels" in message


@pytest.mark.parametrize(
    ("name", "array", "message"),
    [
        ("train-images-idx3-ubyte.gz", np.zeros((50, 27, 28), np.uint8), r"shape \[N, 28, 28\]"),
        ("train-images-idx3-ubyte.gz", np.zeros((50, 784), np.uint8), r"shape \[N, 28, 28\]"),
        ("t10k-labels-idx1-ubyte.gz", np.zeros((20, 1), np.uint8), "1-D label vector"),
        ("t10k-labels-idx1-ubyte.gz", np.full(20, 10, np.uint8), r"label 10 is outside 0\.\.9"),
        ("t10k-images-idx3-ubyte.gz", np.zeros((0, 28, 28), np.uint8), "images but"),
    ],
)
def test_inconsistent_files(tmp_path: Path, name: str, array: np.ndarray, message: str) -> None:
    write_fashion(tmp_path, train=50, test=20)
    write_idx(tmp_path / name, array)
    with pytest.raises(DataError, match=message) as error:
        load_fashion_mnist(tmp_path)
    assert name in str(error.value)


def test_empty_dataset_is_rejected(tmp_path: Path) -> None:
    write_fashion(tmp_path, train=0, test=20)
    with pytest.raises(DataError, match="holds no images"):
        load_fashion_mnist(tmp_path)


@pytest.mark.skipif(
    not (REAL_FASHION_MNIST / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"real Fashion-MNIST not in {REAL_FASHION_MNIST} (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist() -> None:
    data = load_fashion_mnist(REAL_FASHION_MNIST)
    assert data.train_images.shape == (60000, 1, 28, 28)
    assert data.test_images.shape == (10000, 1, 28, 28)
    assert data.train_labels.bincount().tolist() == [6000] * 10
    assert data.test_labels.bincount().tolist() == [1000] * 10
    # The published statistics are the training set's, so normalised training pixels are standard.
    assert abs(data.train_images.mean().item()) < 1e-3
    assert abs(data.train_images.std().item() - 1) < 1e-3
