from pathlib import Path

import torch

from scaletrain.workloads import create_workload
from scaletrain.workloads.base import Part, count_parameters
from scaletrain.workloads.lenet import LeNet5


def test_lenet_has_the_thesis_parameter_count() -> None:
    # conv1 20·25+20, conv2 50·20·25+50, fc 800·500+500, fc 500·10+10 (SPEC §4).
    assert count_parameters(LeNet5()) == 520 + 25_050 + 400_500 + 5_010 == 431_080


def test_lenet_maps_images_to_ten_logits() -> None:
    assert LeNet5()(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_batches_follow_one_permutation_and_parts_slice_it(tiny_fmnist: Path) -> None:
    workload = create_workload("lenet")
    data = workload.load_data(tiny_fmnist, download=False)
    whole = list(workload.train_batches(data, epoch=1, batch_size=16, seed=3))
    halves = [
        list(workload.train_batches(data, epoch=1, batch_size=16, seed=3, part=Part(index, 2))) for index in (0, 1)
    ]
    assert len(whole) == workload.batches_per_epoch(data, 16) == 256 // 16
    for number, (inputs, labels) in enumerate(whole):
        assert torch.equal(torch.cat([halves[0][number][1], halves[1][number][1]]), labels)
        assert torch.equal(torch.cat([halves[0][number][0], halves[1][number][0]]), inputs)
    resumed = list(workload.train_batches(data, epoch=1, batch_size=16, seed=3, numbers=range(5, 8)))
    assert len(resumed) == 3 and torch.equal(resumed[0][1], whole[5][1])
    other_epoch = next(workload.train_batches(data, epoch=2, batch_size=16, seed=3))
    assert not torch.equal(other_epoch[1], whole[0][1])
