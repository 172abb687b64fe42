"""The four ImageNet-class CNNs (SPEC §4): parameter counts, shapes, GoogLeNet's heads, one step each, data."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from scaletrain.errors import ConfigError, DataError
from scaletrain.workloads import create_workload
from scaletrain.workloads.base import Part, count_parameters
from scaletrain.workloads.googlenet import GoogLeNet, GoogLeNetOutputs
from scaletrain.workloads.imagenet import normalise
from scaletrain.workloads.resnet34 import ResNet34
from scaletrain.workloads.squeezenet import SqueezeNet
from scaletrain.workloads.vgg16e import VGG16E

NETWORKS = ("vgg16e", "googlenet", "squeezenet", "resnet34")
TINY = {"data": "synthetic", "image_size": "32", "num_classes": "5", "synthetic_train": "16", "synthetic_test": "5"}


def conv(in_channels: int, out_channels: int, kernel: int, *, bias: bool = True) -> int:
    return in_channels * out_channels * kernel * kernel + (out_channels if bias else 0)


def linear(inputs: int, outputs: int) -> int:
    return inputs * outputs + outputs


def conv_bn(in_channels: int, out_channels: int, kernel: int) -> int:
    return conv(in_channels, out_channels, kernel, bias=False) + 2 * out_channels  # BN scale and shift


def on_meta(build):  # counting needs shapes only: no memory, no initialisation time
    with torch.device("meta"):
        return build()


def test_vgg16e_has_the_thesis_parameter_count() -> None:
    widths = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256), *[(256, 256)] * 3, (256, 512), *[(512, 512)] * 7]
    convolutions = sum(conv(a, b, 3) for a, b in widths)
    fully_connected = linear(512 * 4 * 4, 4096) + linear(4096, 4096) + linear(4096, 1000)
    assert (convolutions, fully_connected) == (20_024_384, 54_436_840)
    assert count_parameters(on_meta(lambda: VGG16E(1000, 128))) == convolutions + fully_connected == 74_461_224
    # No adaptive pooling: the first FC layer grows with the image (7×7×512 inputs at 224).
    assert count_parameters(on_meta(lambda: VGG16E(1000, 224))) == 74_461_224 + (49 - 16) * 512 * 4096


def test_googlenet_counts_with_and_without_the_auxiliary_heads() -> None:
    main = count_parameters(on_meta(lambda: GoogLeNet(1000, aux_logits=False)))
    assert main == 6_624_904

    def head(in_channels: int) -> int:  # table 2.3: conv 1×1 128 (+BN), FC 2048→1024, FC 1024→1000
        return conv_bn(in_channels, 128, 1) + linear(128 * 4 * 4, 1024) + linear(1024, 1000)

    # The heads read 4a (192+208+48+64 = 512 channels) and 4d (112+288+64+64 = 528 channels).
    heads = head(192 + 208 + 48 + 64) + head(112 + 288 + 64 + 64)
    assert heads == 6_379_984
    assert count_parameters(on_meta(lambda: GoogLeNet(1000))) == main + heads == 13_004_888


def test_googlenet_main_network_by_hand() -> None:
    # The 6,624,904 of the reference implementation: conv + BN everywhere, 3×3 in the "5×5" branch.
    inception = [  # input channels, then 1×1, 3×3 reduce, 3×3, 5×5 reduce, 5×5, pool projection (table 2.2)
        (192, 64, 96, 128, 16, 32, 32),
        (256, 128, 128, 192, 32, 96, 64),
        (480, 192, 96, 208, 16, 48, 64),
        (512, 160, 112, 224, 24, 64, 64),
        (512, 128, 128, 256, 24, 64, 64),
        (512, 112, 144, 288, 32, 64, 64),
        (528, 256, 160, 320, 32, 128, 128),
        (832, 256, 160, 320, 32, 128, 128),
        (832, 384, 192, 384, 48, 128, 128),
    ]
    total = conv_bn(3, 64, 7) + conv_bn(64, 64, 1) + conv_bn(64, 192, 3) + linear(1024, 1000)
    for channels, one, reduce3, three, reduce5, five, pool in inception:
        total += conv_bn(channels, one, 1) + conv_bn(channels, reduce3, 1) + conv_bn(reduce3, three, 3)
        total += conv_bn(channels, reduce5, 1) + conv_bn(reduce5, five, 3) + conv_bn(channels, pool, 1)
    assert total == count_parameters(on_meta(lambda: GoogLeNet(1000, aux_logits=False))) == 6_624_904


def test_squeezenet_and_resnet34_counts() -> None:
    fire = [(96, 16, 64), (128, 16, 64), (128, 32, 128), (256, 32, 128), (256, 48, 192), (384, 48, 192)]
    fire += [(384, 64, 256), (512, 64, 256)]
    squeezenet = conv(3, 96, 7) + conv(512, 1000, 1)
    squeezenet += sum(conv(c, s, 1) + conv(s, e, 1) + conv(s, e, 3) for c, s, e in fire)
    assert count_parameters(on_meta(lambda: SqueezeNet(1000))) == squeezenet == 1_248_424

    resnet = conv_bn(3, 64, 7) + linear(512, 1000)
    channels = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for _ in range(blocks):
            resnet += conv_bn(channels, width, 3) + conv_bn(width, width, 3)
            resnet += conv_bn(channels, width, 1) if channels != width else 0  # the downsampling shortcut
            channels = width
    assert count_parameters(on_meta(lambda: ResNet34(1000))) == resnet == 21_797_672


@pytest.mark.parametrize("size", [32, 72])
@pytest.mark.parametrize("name", NETWORKS)
def test_outputs_have_one_score_per_class(name: str, size: int) -> None:
    torch.manual_seed(0)
    model = create_workload(name, {"num_classes": "7", "image_size": str(size)}).build_model().eval()
    with torch.no_grad():
        assert model(torch.randn(2, 3, size, size)).shape == (2, 7)


def test_googlenet_auxiliary_heads_only_in_training() -> None:
    torch.manual_seed(0)
    model, images = GoogLeNet(5), torch.randn(2, 3, 64, 64)
    outputs = model.train()(images)
    assert isinstance(outputs, GoogLeNetOutputs) and [o.shape for o in outputs] == [(2, 5)] * 3
    assert not torch.allclose(outputs.aux1, outputs.aux2)  # two different heads
    with torch.no_grad():
        evaluated = model.eval()(images)
    assert isinstance(evaluated, torch.Tensor) and evaluated.shape == (2, 5)
    assert isinstance(GoogLeNet(5, aux_logits=False).train()(images), torch.Tensor)


def test_googlenet_objective_adds_three_tenths_of_each_auxiliary_loss() -> None:
    workload = create_workload("googlenet", TINY)
    data = workload.load_data(None)
    torch.manual_seed(0)
    model = workload.build_model().train()
    inputs, labels = next(workload.train_batches(data, epoch=0, batch_size=4, seed=0))
    torch.manual_seed(1)  # the same dropout masks for both forward passes
    outputs = model(inputs)
    main = F.cross_entropy(outputs[0], labels)
    expected = main + 0.3 * (F.cross_entropy(outputs[1], labels) + F.cross_entropy(outputs[2], labels))
    torch.manual_seed(1)
    objective, logged, state = workload.training_loss(model, (inputs, labels), None)
    assert objective.item() == pytest.approx(expected.item(), rel=1e-6)
    assert logged.item() == pytest.approx(main.item(), rel=1e-6) and not logged.requires_grad and state is None
    assert objective.item() > logged.item() + 0.3 * 2 * 1.0  # two aux losses of about log 5 each


@pytest.mark.parametrize("name", NETWORKS)
def test_one_training_step_changes_every_weight(name: str) -> None:
    workload = create_workload(name, TINY)
    data = workload.load_data(None)
    torch.manual_seed(0)
    model = workload.build_model().train()
    before = {key: value.clone() for key, value in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batch = next(workload.train_batches(data, epoch=0, batch_size=2, seed=0))
    objective, loss, _ = workload.training_loss(model, batch, None)
    assert abs(loss.item() - math.log(5)) < 0.5  # near the uniform guess at initialisation
    objective.backward()
    optimizer.step()
    parameters = dict(model.named_parameters())
    unchanged = [key for key in parameters if torch.equal(before[key], parameters[key].detach())]
    assert unchanged == []


def test_synthetic_parts_are_slices_of_the_global_batch() -> None:
    workload = create_workload("resnet34", TINY)
    data = workload.load_data(None)
    whole = list(workload.train_batches(data, epoch=1, batch_size=8, seed=3))
    assert len(whole) == workload.batches_per_epoch(data, 8) == 2
    for count in (2, 4):
        parts = [
            list(workload.train_batches(data, epoch=1, batch_size=8, seed=3, part=Part(i, count))) for i in range(count)
        ]
        for number, (inputs, labels) in enumerate(whole):
            assert torch.equal(torch.cat([part[number][0] for part in parts]), inputs)
            assert torch.equal(torch.cat([part[number][1] for part in parts]), labels)
    resumed = next(workload.train_batches(data, epoch=1, batch_size=8, seed=3, numbers=range(1, 2)))
    assert torch.equal(resumed[0], whole[1][0])
    other_seed = next(workload.train_batches(data, epoch=1, batch_size=8, seed=4))
    assert not torch.equal(other_seed[0], whole[0][0])
    # The same sample is the same image in every epoch; the test images are others.
    train_image = data.train.take(torch.tensor([0]))[0]
    assert torch.equal(data.train.take(torch.tensor([0]))[0], train_image)
    assert not torch.equal(data.test.take(torch.tensor([0]))[0], train_image)


def test_evaluation_is_the_same_in_any_batch_size() -> None:
    workload = create_workload("squeezenet", TINY)
    data = workload.load_data(None)
    torch.manual_seed(0)
    model = workload.build_model()
    whole = workload.evaluate(model, data)
    workload.eval_batch_size = 2  # 5 test images in batches of 2, 2, 1
    assert workload.evaluate(model, data) == pytest.approx(whole, rel=1e-6)
    images, labels = data.test.take(torch.arange(5))
    with torch.no_grad():
        logits = model.eval()(normalise(images))
    assert whole["test_loss"] == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
    assert whole["test_accuracy"] == pytest.approx((logits.argmax(1) == labels).sum().item() / 5)


def test_options_defaults_and_errors() -> None:
    assert create_workload("vgg16e").options.image_size == 128
    for name in ("googlenet", "squeezenet", "resnet34"):
        options = create_workload(name).options
        assert (options.image_size, options.num_classes, options.data) == (224, 257, "folder")
    with pytest.raises(ConfigError, match="image_size must be ≥ 32.*--image-size 32"):
        create_workload("resnet34", {"image_size": "16"})
    with pytest.raises(ConfigError, match="data must be one of folder, synthetic"):
        create_workload("resnet34", {"data": "imagenet"})
    with pytest.raises(ConfigError, match="test_fraction must be between 0 and 1"):
        create_workload("googlenet", {"test_fraction": "1"})
    with pytest.raises(ConfigError, match="valid options: .*image_size.*num_classes"):
        create_workload("squeezenet", {"classes": "10"})


def test_dataset_text_says_what_the_data_is() -> None:
    synthetic = create_workload("squeezenet", TINY).dataset
    assert "synthetic" in synthetic and "for timing only; accuracy is meaningless" in synthetic
    assert "32×32" in synthetic and "5 classes" in synthetic
    folder = create_workload("vgg16e").dataset
    assert "Caltech256" in folder and "128×128" in folder and "10%" in folder


def test_folder_data_through_the_workload(tiny_images: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    workload = create_workload("squeezenet", {"num_classes": "3", "image_size": "32", "test_fraction": "0.25"})
    data = workload.load_data(tiny_images.parent)  # finds 256_ObjectCategories below --data-dir
    assert (len(data.train), len(data.test)) == (9, 3)
    assert len(list((tmp_path / "xdg/scaletrain/image-folder").glob("256_ObjectCategories-32px-*.pt"))) == 1
    inputs, labels = next(workload.train_batches(data, epoch=0, batch_size=9, seed=0))
    assert inputs.dtype == torch.float32 and sorted(labels.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert inputs.mean().abs() < 3 and inputs.std() > 0.1  # normalised, not raw 0..255
    with pytest.raises(DataError, match="3 class folders but the network has 2 outputs.*--num-classes 3"):
        create_workload("resnet34", {"num_classes": "2"}).load_data(tiny_images)
