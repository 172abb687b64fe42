"""Results name their machine: what a profile records, how reports name it, and the note for another CPU."""

from __future__ import annotations

import json

import torch
from tests.helpers import REPO

from scaletrain.estimate.profile import Profile
from scaletrain.measure.machine import NOT_RECORDED, machine_info, machine_label, machine_note

OTHER = {"cpu_model": "Made-up CPU 9000", "isa": "AVX512", "cores": 64, "torch_version": "2.13.0+cpu"}


def test_the_machine_is_the_cpu_its_instruction_set_cores_and_torch_build():
    here = machine_info("100mbit")
    assert here["isa"] == torch.backends.cpu.get_cpu_capability()
    assert here["torch_version"] == torch.__version__
    assert here["torch_build"] == (f"cuda {torch.version.cuda}" if torch.version.cuda else here["torch_build"])
    assert here["cpu_model"] and here["cores"] and here["network"] == "100mbit"
    label = f"{here['cpu_model']} ({here['isa']}), {here['cores']} cores, torch {torch.__version__}"
    assert machine_label(here) == label


def test_a_saved_profile_keeps_its_machine(tmp_path):
    saved = Profile("toy", 8, t_grad=0.1, t_comm=0.01, machine=machine_info()).save(tmp_path / "p.json")
    loaded = Profile.load(saved)
    assert loaded.machine == json.loads(json.dumps(machine_info()))
    assert machine_label(loaded.machine).startswith(f"{machine_info()['cpu_model']} ({machine_info()['isa']})")
    assert machine_note(loaded.machine, machine_info()) is None  # measured here


def test_old_profiles_load_and_say_their_machine_was_not_recorded(tmp_path):
    # a profile of the first format: no machine, no samples
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"workload": "lenet", "batch_size": 64, "t_grad": 0.02, "t_comm": 0.001}))
    loaded = Profile.load(old)
    assert loaded.machine == {} and machine_label(loaded.machine) == NOT_RECORDED == "machine not recorded"
    assert machine_note(loaded.machine, machine_info()) is None  # nothing to compare
    # a saved validation's profile from before the instruction set was recorded
    saved = Profile.load(REPO / "results" / "validation" / "lenet-loopback" / "profile.json")
    assert "isa" not in saved.machine and "(ISA not recorded)" in machine_label(saved.machine)


def test_a_profile_of_another_cpu_is_said_to_be_so_in_one_line():
    here = {"cpu_model": "AMD EPYC", "isa": "AVX2"}
    note = machine_note(OTHER, here)
    assert note == "note: this profile was measured on Made-up CPU 9000 (AVX512), this machine is AMD EPYC (AVX2)"
    assert "\n" not in note
    # the same model with another instruction set (torch's kernels differ) is another machine too
    assert machine_note({"cpu_model": "AMD EPYC", "isa": "AVX512"}, here) is not None
    assert machine_note({"cpu_model": "AMD EPYC", "isa": "AVX2", "cores": 16}, here) is None
