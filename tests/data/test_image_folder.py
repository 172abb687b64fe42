"""The image-folder reader: classes, labels, RGB conversion, resizing, the fixed split, the cache, errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch
from PIL import Image
from tests.helpers import GREY_IMAGE, IMAGE_CLASSES, image_colour, make_image_folder

from scaletrain.data import image_folder
from scaletrain.data.image_folder import decode_image, is_held_out, load_image_folder
from scaletrain.errors import DataError


def expected_image(label: int, index: int, size: int) -> torch.Tensor:
    if (label, index) == GREY_IMAGE[:2]:
        return torch.full((3, size, size), GREY_IMAGE[2], dtype=torch.uint8)
    return torch.tensor(image_colour(label, index), dtype=torch.uint8).view(3, 1, 1).expand(3, size, size)


def test_classes_labels_shapes_and_pixels(tiny_images: Path) -> None:
    data = load_image_folder(tiny_images, image_size=32, test_fraction=0.25)
    assert data.classes == IMAGE_CLASSES  # sorted folder names; the nested folder and RENAME2 are no samples
    # 4 images per class, the 4th of each held out: 3 train + 1 test per class.
    assert data.train.images.shape == (9, 3, 32, 32) and data.train.images.dtype == torch.uint8
    assert data.test.images.shape == (3, 3, 32, 32)
    assert data.train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert data.test.labels.tolist() == [0, 1, 2]
    for row, (label, index) in enumerate((label, index) for label in range(3) for index in range(3)):
        # Solid colours survive resizing (PNG exactly, JPEG within its rounding); grey becomes R = G = B.
        difference = (data.train.images[row].int() - expected_image(label, index, 32).int()).abs().max()
        assert difference <= 3, (label, index, difference)
    for label in range(3):
        assert (data.test.images[label].int() - expected_image(label, 3, 32).int()).abs().max() <= 3


def test_resizing_keeps_the_picture(tmp_path: Path) -> None:
    picture = Image.new("RGB", (80, 40), (0, 0, 0))
    picture.paste((255, 255, 255), (40, 0, 80, 40))  # right half white
    picture.save(tmp_path / "halves.png")
    image = decode_image(tmp_path / "halves.png", 32)
    assert image.shape == (3, 32, 32)
    assert image[:, :, :15].max() == 0 and image[:, :, 17:].min() == 255


def test_split_is_fixed_and_spread_evenly(tiny_images: Path) -> None:
    assert [index for index in range(20) if is_held_out(index, 0.1)] == [9, 19]
    assert [index for index in range(6) if is_held_out(index, 0.5)] == [1, 3, 5]
    assert sum(is_held_out(index, 0.3) for index in range(100)) == 30
    first = load_image_folder(tiny_images, image_size=32, test_fraction=0.5)
    again = load_image_folder(tiny_images, image_size=32, test_fraction=0.5)
    assert torch.equal(first.test.images, again.test.images) and torch.equal(first.train.labels, again.train.labels)
    # Files 1 and 3 (0-based) of each class are the test set.
    assert (first.test.images[1].int() - expected_image(0, 3, 32).int()).abs().max() <= 3


def test_cache_serves_the_second_load_without_decoding(
    tiny_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    first = load_image_folder(tiny_images, image_size=32, test_fraction=0.25, cache=cache)
    files = list(cache.iterdir())
    assert not first.from_cache and len(files) == 1
    assert files[0].name.startswith("256_ObjectCategories-32px-") and files[0].suffix == ".pt"

    def no_decoding(path: Path, size: int) -> torch.Tensor:
        raise AssertionError(f"decoded {path} although the cache holds it")

    monkeypatch.setattr(image_folder, "decode_image", no_decoding)
    second = load_image_folder(tiny_images, image_size=32, test_fraction=0.25, cache=cache)
    assert second.from_cache and second.classes == first.classes
    assert torch.equal(second.train.images, first.train.images) and torch.equal(second.test.labels, first.test.labels)

    # Another size, another split or a changed file is another cache entry, not a stale hit.
    monkeypatch.undo()
    assert not load_image_folder(tiny_images, image_size=40, test_fraction=0.25, cache=cache).from_cache
    assert not load_image_folder(tiny_images, image_size=32, test_fraction=0.5, cache=cache).from_cache
    changed = tiny_images / IMAGE_CLASSES[2] / "003_0001.png"
    Image.new("RGB", (30, 50), (1, 2, 3)).save(changed)
    reloaded = load_image_folder(tiny_images, image_size=32, test_fraction=0.25, cache=cache)
    assert not reloaded.from_cache and reloaded.train.images[6, :, 0, 0].tolist() == [1, 2, 3]
    assert len(list(cache.glob("*.pt"))) == 4 and not list(cache.glob("*.tmp"))  # renamed into place


def test_a_corrupt_cache_is_decoded_again(tiny_images: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_image_folder(tiny_images, image_size=32, cache=cache, test_fraction=0.25)
    (cache_file,) = cache.iterdir()
    cache_file.write_bytes(pickle.dumps("half a file"))
    with pytest.warns(UserWarning, match="unreadable image cache"):
        data = load_image_folder(tiny_images, image_size=32, cache=cache, test_fraction=0.25)
    assert not data.from_cache and len(data.train) == 9
    assert load_image_folder(tiny_images, image_size=32, cache=cache, test_fraction=0.25).from_cache  # rewritten


def test_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such folder.*one sub-folder of images per class"):
        load_image_folder(tmp_path / "absent", image_size=32)


def test_no_class_folders(tmp_path: Path) -> None:
    (tmp_path / "loose.jpg").write_bytes(b"")
    with pytest.raises(DataError, match="holds no class folders.*001.ak47/001_0001.jpg.*--data-dir"):
        load_image_folder(tmp_path, image_size=32)


def test_class_folder_without_images(tiny_images: Path) -> None:
    (tiny_images / "004.empty").mkdir()
    (tiny_images / "004.empty" / "notes.txt").write_text("no pictures here")
    with pytest.raises(DataError, match="004.empty holds no images.*add its images or remove the folder"):
        load_image_folder(tiny_images, image_size=32)


def test_undecodable_image_is_named(tiny_images: Path) -> None:
    broken = tiny_images / IMAGE_CLASSES[1] / "002_0002.jpg"
    broken.write_bytes(b"\xff\xd8 this is not a JPEG")
    with pytest.raises(DataError, match=f"{broken}: cannot decode the image.*delete or replace the file"):
        load_image_folder(tiny_images, image_size=32, test_fraction=0.25)


def test_more_classes_than_outputs(tiny_images: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image_folder, "decode_image", lambda path, size: pytest.fail("decoded before checking"))
    with pytest.raises(DataError, match="has 3 class folders but the network has 2 outputs.*--num-classes 3"):
        load_image_folder(tiny_images, image_size=32, num_classes=2)


def test_a_split_that_leaves_a_set_empty(tmp_path: Path) -> None:
    folder = make_image_folder(tmp_path / "images", per_class=2)
    with pytest.raises(DataError, match="leaves the test set empty.*test_fraction"):
        load_image_folder(folder, image_size=32, test_fraction=0.1)


def test_an_unwritable_cache_only_warns(tiny_images: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache folder should be")  # stops root as well as anyone
    with pytest.warns(UserWarning, match="could not write the image cache"):
        data = load_image_folder(tiny_images, image_size=32, test_fraction=0.25, cache=cache)
    assert len(data.train) == 9 and cache.read_text().startswith("a file")
