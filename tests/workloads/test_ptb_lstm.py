import itertools
from pathlib import Path

import pytest
import torch

from scaletrain.errors import ConfigError
from scaletrain.train.plan import WorkerPlan
from scaletrain.workloads import create_workload
from scaletrain.workloads.base import Part, count_parameters


def test_zaremba_small_parameter_count() -> None:
    workload = create_workload("ptb-lstm")
    # embedding 10000·200, 2 LSTM layers of 4·200·(200+200) + 2·4·200 biases, decoder 200·10000+10000
    expected = 10_000 * 200 + 2 * (4 * 200 * 400 + 2 * 4 * 200) + 200 * 10_000 + 10_000
    assert count_parameters(workload.build_model()) == expected == 4_653_200


def test_windows_carry_on_and_targets_are_shifted(tiny_ptb: Path) -> None:
    workload = create_workload("ptb-lstm", {"num_steps": "5", "vocab_size": "100"})
    data = workload.load_data(tiny_ptb)
    batches = list(workload.train_batches(data, epoch=0, batch_size=4, seed=0))
    assert len(batches) == workload.batches_per_epoch(data, 4) > 2
    first, second = batches[0], batches[1]
    assert first[0].shape == (4, 5)
    assert torch.equal(first[0][:, 1:], first[1][:, :-1])  # targets are the next words
    assert torch.equal(second[0][:, 0], first[1][:, -1])  # the next window continues each row
    rows = list(workload.train_batches(data, epoch=0, batch_size=4, seed=0, part=Part(1, 2)))
    assert torch.equal(rows[0][0], first[0][2:])  # a worker's part is a slice of the rows


def test_an_async_workers_chunk_continues_its_own_rows(tiny_ptb: Path) -> None:
    # Asynchronous workers take whole batches (every row) from a contiguous chunk of the epoch's windows,
    # so the state each carries from one window to its next belongs to the same rows of the same text.
    workload = create_workload("ptb-lstm", {"num_steps": "3", "vocab_size": "100"})
    data = workload.load_data(tiny_ptb)
    count = workload.batches_per_epoch(data, 4)
    everything = list(workload.train_batches(data, epoch=0, batch_size=4, seed=0))
    for index in range(3):
        numbers = WorkerPlan(chunk=Part(index, 3)).numbers(0, count)
        mine = list(workload.train_batches(data, epoch=0, batch_size=4, seed=0, numbers=numbers))
        assert len(mine) == len(numbers) > 1
        for (_, targets), following in itertools.pairwise(mine):
            assert torch.equal(following[0][:, 0], targets[:, -1])  # the next window continues each row
        assert all(torch.equal(a[0], everything[n][0]) for a, n in zip(mine, numbers, strict=True))


def test_hidden_state_is_carried_and_detached(tiny_ptb: Path) -> None:
    workload = create_workload("ptb-lstm", {"num_steps": "5", "vocab_size": "100", "hidden_size": "8"})
    data = workload.load_data(tiny_ptb)
    model = workload.build_model()
    batches = workload.train_batches(data, epoch=0, batch_size=4, seed=0)
    state = workload.initial_state(model, 4)
    objective, loss, state = workload.training_loss(model, next(batches), state)
    assert objective.item() == pytest.approx(loss.item() * 5, rel=1e-6)  # Zaremba's summed-over-steps cost
    assert not state[0].requires_grad and state[0].abs().sum() > 0
    assert loss.item() == pytest.approx(torch.log(torch.tensor(100.0)).item(), rel=0.05)  # ~uniform at init


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size(tiny_ptb: Path) -> None:
    workload = create_workload("ptb-lstm", {"num_steps": "5", "vocab_size": "100", "hidden_size": "8"})
    data = workload.load_data(tiny_ptb)
    model = workload.build_model()
    with torch.no_grad():
        model.decoder.weight.zero_()
        model.decoder.bias.zero_()
    assert workload.perplexity(model, data.test) == pytest.approx(100.0, rel=1e-5)


def test_bad_options_name_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match="valid options: .*num_steps"):
        create_workload("ptb-lstm", {"steps": "5"})
    with pytest.raises(ConfigError, match="not a valid int"):
        create_workload("ptb-lstm", {"num_steps": "many"})
    with pytest.raises(ConfigError, match="train_split must be"):
        create_workload("ptb-lstm", {"train_split": "everything"})
