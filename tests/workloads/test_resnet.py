"""The parametric ResNet: sizes against the literature, the block shapes, options, and augmentation that
gives every worker's part of a batch exactly what one process would compute."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest
import torch
from tests.helpers import make_fashion_mnist
from torch import nn

from scaletrain.data.sampler import Part
from scaletrain.errors import ConfigError
from scaletrain.workloads import create_workload
from scaletrain.workloads.base import count_parameters
from scaletrain.workloads.classification import epoch_permutation
from scaletrain.workloads.resnet import PAD, ResidualBlock, crop_and_flip


def projection_parameters(model: nn.Module) -> int:
    return sum(count_parameters(m.shortcut) for m in model.modules() if isinstance(m, ResidualBlock))


@pytest.mark.parametrize(
    ("name", "ours", "literature_millions"),
    [("resnet20", 272_474, 0.27), ("resnet32", 466_906, 0.46), ("resnet56", 855_770, 0.85)],
)
def test_preset_sizes_match_he_et_al_once_the_projection_shortcuts_are_left_out(
    name: str, ours: int, literature_millions: float
) -> None:
    model = create_workload(name).build_model()
    assert count_parameters(model) == ours
    # He et al. (2016, Table 6) count option A shortcuts (zero padding, no parameters).
    option_a = ours - projection_parameters(model)
    assert round(option_a / 1e6, 2) == literature_millions


def test_a_bottleneck_block_reduces_then_expands_four_times() -> None:
    model = create_workload("resnet", {"bottleneck": "true", "blocks": "2,1", "stages": "2"}).build_model()
    blocks = [m for m in model.modules() if isinstance(m, ResidualBlock)]
    assert len(blocks) == 3
    convs = [m for m in blocks[0].residual if isinstance(m, nn.Conv2d)]
    assert [c.kernel_size[0] for c in convs] == [1, 3, 1]
    assert [c.out_channels for c in convs] == [16, 16, 64]
    assert blocks[2].out_channels == 128 and blocks[2].residual[3].stride == (2, 2)  # the 3×3 strides
    assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)


def test_layers_per_block_and_fashion_mnist_input() -> None:
    model = create_workload("resnet", {"layers": "3", "dataset": "fashion-mnist", "blocks": "1"}).build_model()
    block = next(m for m in model.modules() if isinstance(m, ResidualBlock))
    assert sum(isinstance(m, nn.Conv2d) for m in block.residual) == 3
    assert model.features[0].in_channels == 1
    assert model(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"blocks": "3,3"}, "3 comma-separated counts"),
        ({"dataset": "imagenet"}, "dataset must be one of"),
        ({"bottleneck": "true", "layers": "2"}, "bottleneck block needs layers ≥ 3"),
        ({"augment": "maybe"}, "augment must be"),
        ({"train_samples": "-1"}, "train_samples must be ≥ 0"),
    ],
)
def test_bad_options_name_the_fix(options: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        create_workload("resnet", options)


def test_train_samples_keeps_the_first_training_images_and_the_whole_test_set(tmp_path: Path) -> None:
    data_dir = make_fashion_mnist(tmp_path / "fmnist", train=60, test=20)
    whole = create_workload("resnet", {"dataset": "fashion-mnist"}).load_data(data_dir, download=False)
    first = create_workload("resnet", {"dataset": "fashion-mnist", "train_samples": "25"}).load_data(
        data_dir, download=False
    )
    assert torch.equal(first.train_inputs, whole.train_inputs[:25]) and torch.equal(
        first.train_labels, whole.train_labels[:25]
    )
    assert torch.equal(first.test_labels, whole.test_labels)


def test_a_preset_refuses_to_change_its_depth_but_takes_its_own_value() -> None:
    with pytest.raises(ConfigError, match="resnet32 fixes blocks"):
        create_workload("resnet32", {"blocks": "3"})
    assert create_workload("resnet32", {"blocks": "5", "stages": "3"}).options.blocks == "5"


def test_crop_and_flip_shifts_pads_with_zeros_and_mirrors() -> None:
    image = torch.arange(16.0).view(1, 1, 4, 4) + 1
    shifted = crop_and_flip(image, torch.tensor([[PAD + 1, PAD - 1]]), torch.tensor([False]))[0, 0]
    assert shifted[0].tolist() == [0.0, 5.0, 6.0, 7.0]  # one row down, one column right: zeros come in
    assert shifted[3].tolist() == [0.0, 0.0, 0.0, 0.0]
    mirrored = crop_and_flip(image, torch.tensor([[PAD, PAD]]), torch.tensor([True]))[0, 0]
    assert mirrored[0].tolist() == [4.0, 3.0, 2.0, 1.0]


def write_cifar_archive(path: Path, train_per_batch: int, test: int) -> Path:
    """A ``cifar-10-binary.tar.gz`` in the real layout: label byte + 3,072 pixel bytes per record."""
    generator = torch.Generator().manual_seed(0)

    def records(count: int) -> bytes:
        labels = torch.randint(0, 10, (count, 1), generator=generator, dtype=torch.uint8)
        pixels = torch.randint(0, 256, (count, 3072), generator=generator, dtype=torch.uint8)
        return torch.cat([labels, pixels], dim=1).numpy().tobytes()

    members = {f"data_batch_{i}.bin": records(train_per_batch) for i in range(1, 6)}
    members["test_batch.bin"] = records(test)
    members["batches.meta.txt"] = "\n".join(
        ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    ).encode()
    with tarfile.open(path, "w:gz") as archive:
        for name, content in members.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(content)
            archive.addfile(info, io.BytesIO(content))
    return path


def test_cifar10_trains_from_the_binary_archive_with_augmentation_that_splits_exactly(tmp_path: Path) -> None:
    write_cifar_archive(tmp_path / "cifar-10-binary.tar.gz", train_per_batch=8, test=4)
    workload = create_workload("resnet20", {"augment": "on"})
    data = workload.load_data(tmp_path, download=False)
    assert tuple(data.train_inputs.shape) == (40, 3, 32, 32) and data.train_inputs.dtype == torch.uint8
    whole, labels = next(workload.train_batches(data, epoch=1, batch_size=8, seed=3))
    assert whole.dtype == torch.float32 and abs(whole.mean().item()) < 1.0  # normalised
    assert labels.tolist() == data.train_labels[epoch_permutation(40, seed=3, epoch=1)[:8]].tolist()
    halves = [next(workload.train_batches(data, epoch=1, batch_size=8, seed=3, part=Part(i, 2))) for i in (0, 1)]
    torch.testing.assert_close(torch.cat([h[0] for h in halves]), whole, rtol=0, atol=0)
    again, _ = next(workload.train_batches(data, epoch=1, batch_size=8, seed=3))
    torch.testing.assert_close(again, whole, rtol=0, atol=0)
    images, indices = data.train_inputs[:8].float(), torch.arange(8)
    first, second = (workload.augment(images, indices, seed=3, epoch=epoch) for epoch in (1, 2))
    assert not torch.equal(first, second), "another epoch draws other crops and flips for the same samples"
    plain = create_workload("resnet20", {"augment": "off"})
    unaugmented, _ = next(plain.train_batches(data, epoch=1, batch_size=8, seed=3))
    assert not torch.equal(unaugmented, whole)
    assert workload.evaluate(workload.build_model(), data)["test_accuracy"] >= 0.0
