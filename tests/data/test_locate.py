"""Search order and error messages for locating Fashion-MNIST, Penn Treebank and image folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from scaletrain.data.idx import find_fashion_mnist
from scaletrain.data.image_folder import find_image_folder, image_cache_dir
from scaletrain.data.locate import ENV_DATA, ENV_OFFLINE, cache_dir, is_offline
from scaletrain.data.ptb import find_ptb
from scaletrain.errors import DataError

FASHION_NAMES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)


def make_fashion(folder: Path, suffix: str = ".gz") -> Path:
    """Create the four file names; locating only looks at names, so the contents do not matter."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in FASHION_NAMES:
        (folder / f"{name}{suffix}").write_bytes(b"")
    return folder


def make_ptb(folder: Path, *, train: bool = False) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("valid", "test", "train") if train else ("valid", "test"):
        (folder / f"ptb.{split}.txt").write_text("a b\n")
    return folder


@pytest.fixture
def environ(tmp_path: Path) -> dict[str, str]:
    """An environment with its own empty cache, so the user's real cache and variables never leak in."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_cache_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir({"XDG_CACHE_HOME": "/x/y"}) == Path("/x/y/scaletrain")
    assert cache_dir({}) == tmp_path / "home" / ".cache" / "scaletrain"
    assert cache_dir({"XDG_CACHE_HOME": ""}) == tmp_path / "home" / ".cache" / "scaletrain"
    assert cache_dir({"XDG_CACHE_HOME": "relative"}) == tmp_path / "home" / ".cache" / "scaletrain"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "scaletrain"


def test_is_offline() -> None:
    assert is_offline({ENV_OFFLINE: "1"})
    assert not is_offline({ENV_OFFLINE: "0"})
    assert not is_offline({})


# --- Fashion-MNIST -----------------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".gz", ""])
def test_data_dir_is_used(tmp_path: Path, environ: dict[str, str], suffix: str) -> None:
    folder = make_fashion(tmp_path / "mine", suffix)
    assert find_fashion_mnist(folder, environ=environ, system_dirs=[]) == folder


def test_data_dir_subfolder_is_used(tmp_path: Path, environ: dict[str, str]) -> None:
    folder = make_fashion(tmp_path / "mine" / "fashion-mnist")
    assert find_fashion_mnist(tmp_path / "mine", environ=environ, system_dirs=[]) == folder


def test_data_dir_without_the_files_is_an_error_even_if_others_have_them(
    tmp_path: Path, environ: dict[str, str]
) -> None:
    system = make_fashion(tmp_path / "system")
    make_fashion(tmp_path / "mine")
    (tmp_path / "mine" / "train-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(DataError) as error:
        find_fashion_mnist(tmp_path / "mine", environ=environ, system_dirs=[system])
    message = str(error.value)
    assert "missing (train-labels-idx1-ubyte.gz)" in message
    assert "--data-dir" in message
    assert "apt-get install dataset-fashion-mnist" in message


def test_env_data_comes_before_system_dirs(tmp_path: Path, environ: dict[str, str]) -> None:
    system = make_fashion(tmp_path / "system")
    shared = make_fashion(tmp_path / "shared" / "fashion-mnist")
    environ[ENV_DATA] = str(tmp_path / "shared")
    assert find_fashion_mnist(None, environ=environ, system_dirs=[system]) == shared
    make_fashion(tmp_path / "shared")
    assert find_fashion_mnist(None, environ=environ, system_dirs=[system]) == tmp_path / "shared"


def test_env_data_without_files_falls_through(tmp_path: Path, environ: dict[str, str]) -> None:
    system = make_fashion(tmp_path / "system")
    environ[ENV_DATA] = str(tmp_path / "empty")
    assert find_fashion_mnist(None, environ=environ, system_dirs=[tmp_path / "none", system]) == system


def test_system_dir_comes_before_cache(tmp_path: Path, environ: dict[str, str]) -> None:
    system = make_fashion(tmp_path / "system")
    make_fashion(tmp_path / "cache" / "scaletrain" / "fashion-mnist")
    assert find_fashion_mnist(None, environ=environ, system_dirs=[system]) == system


def test_cache_is_searched_last(tmp_path: Path, environ: dict[str, str]) -> None:
    cached = make_fashion(tmp_path / "cache" / "scaletrain" / "fashion-mnist")
    assert find_fashion_mnist(None, download=False, environ=environ, system_dirs=[]) == cached


def test_partial_folders_are_skipped(tmp_path: Path, environ: dict[str, str]) -> None:
    partial = make_fashion(tmp_path / "partial")
    (partial / "t10k-images-idx3-ubyte.gz").unlink()
    complete = make_fashion(tmp_path / "complete")
    assert find_fashion_mnist(None, environ=environ, system_dirs=[partial, complete]) == complete


@pytest.mark.parametrize(("download", "offline", "reason"), [(False, "", "not allowed"), (True, "1", "=1")])
def test_not_found_lists_places_and_fixes(
    tmp_path: Path, environ: dict[str, str], download: bool, offline: str, reason: str
) -> None:
    environ[ENV_DATA] = str(tmp_path / "shared")
    environ[ENV_OFFLINE] = offline
    with pytest.raises(DataError) as error:
        find_fashion_mnist(None, download=download, environ=environ, system_dirs=[tmp_path / "system"])
    message = str(error.value)
    for place in (
        tmp_path / "shared",
        tmp_path / "shared" / "fashion-mnist",
        tmp_path / "system",
        tmp_path / "cache" / "scaletrain" / "fashion-mnist",
    ):
        assert str(place) in message
    assert reason in message
    assert "apt-get install dataset-fashion-mnist" in message
    assert "--data-dir" in message
    assert "go online" in message
    assert not (tmp_path / "cache").exists()


# --- Penn Treebank -----------------------------------------------------------------------------------


def test_ptb_data_dir_and_subfolder(tmp_path: Path, environ: dict[str, str]) -> None:
    direct = make_ptb(tmp_path / "direct")
    assert find_ptb(direct, environ=environ) == direct
    nested = make_ptb(tmp_path / "nested" / "ptb")
    assert find_ptb(tmp_path / "nested", environ=environ) == nested


def test_ptb_data_dir_missing_does_not_fall_through(tmp_path: Path, environ: dict[str, str]) -> None:
    elsewhere = make_ptb(tmp_path / "elsewhere", train=True)
    with pytest.raises(DataError) as error:
        find_ptb(tmp_path / "empty", environ=environ, system_dirs=[elsewhere])
    message = str(error.value)
    assert "--data-dir" in message
    assert "simple-examples" in message
    assert str(tmp_path / "empty" / "ptb") in message


def test_ptb_env_then_system_dirs_then_cache(tmp_path: Path, environ: dict[str, str]) -> None:
    cached = make_ptb(tmp_path / "cache" / "scaletrain" / "ptb")
    assert find_ptb(None, environ=environ) == cached
    system = make_ptb(tmp_path / "system")
    assert find_ptb(None, environ=environ, system_dirs=[system]) == system
    shared = make_ptb(tmp_path / "shared" / "ptb")
    environ[ENV_DATA] = str(tmp_path / "shared")
    assert find_ptb(None, environ=environ, system_dirs=[system]) == shared


def test_ptb_prefers_a_folder_with_the_training_text(tmp_path: Path, environ: dict[str, str]) -> None:
    small = make_ptb(tmp_path / "small")
    full = make_ptb(tmp_path / "full", train=True)
    assert find_ptb(None, environ=environ, system_dirs=[small, full]) == full


def test_ptb_needs_valid_and_test(tmp_path: Path, environ: dict[str, str]) -> None:
    folder = make_ptb(tmp_path / "folder")
    (folder / "ptb.test.txt").unlink()
    with pytest.raises(DataError) as error:
        find_ptb(None, environ=environ, system_dirs=[folder])
    message = str(error.value)
    assert str(folder) in message
    assert "Mikolov" in message
    assert "--data-dir" in message


def test_image_folder_prefers_the_caltech_subfolder_then_takes_the_folder_itself(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "caltech256" / "256_ObjectCategories").mkdir(parents=True)
    assert find_image_folder(data) == data / "caltech256" / "256_ObjectCategories"
    (data / "256_ObjectCategories").mkdir()
    assert find_image_folder(data) == data / "256_ObjectCategories"
    own = tmp_path / "my-images"
    own.mkdir()
    assert find_image_folder(own) == own  # any folder of class folders


def test_image_folder_from_the_environment_then_the_cache(tmp_path: Path, environ: dict[str, str]) -> None:
    cached = cache_dir(environ) / "caltech256"
    cached.mkdir(parents=True)
    assert find_image_folder(None, environ=environ) == cached
    (cached / "256_ObjectCategories").mkdir()
    assert find_image_folder(None, environ=environ) == cached / "256_ObjectCategories"
    shared = tmp_path / "shared"
    (shared / "256_ObjectCategories").mkdir(parents=True)
    assert find_image_folder(None, environ={**environ, ENV_DATA: str(shared)}) == shared / "256_ObjectCategories"
    assert image_cache_dir(environ) == cache_dir(environ) / "image-folder"


@pytest.mark.parametrize("given", [True, False])
def test_missing_image_folder_says_where_to_get_caltech256(
    tmp_path: Path, environ: dict[str, str], given: bool
) -> None:
    with pytest.raises(DataError) as caught:
        find_image_folder(tmp_path / "nowhere" if given else None, environ=environ)
    message = str(caught.value)
    assert "https://data.caltech.edu/records/nyy15-4j048" in message and "256_ObjectCategories.tar" in message
    assert "tar -xf 256_ObjectCategories.tar -C DIR" in message and "--data-dir DIR" in message
    assert "-o data=synthetic" in message
    assert (f"--data-dir {tmp_path / 'nowhere'}" in message) == given
    assert str(cache_dir(environ) / "caltech256") in message  # a place searched
