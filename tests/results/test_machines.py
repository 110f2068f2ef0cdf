"""This box's folder of experiments (tunebook.results.machines): named from the hardware unless
named once, never one of the committed reference machines, and an older tunebook's experiments
at the top of outputs/ moved in with nothing lost."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import COMMITTED_MACHINES
from tunebook.cli import main as cli
from tunebook.present import overview
from tunebook.results import machines


@pytest.fixture
def outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "outputs"
    monkeypatch.setenv("TUNEBOOK_OUTPUTS", str(root))
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv(machines.MACHINE_ENV, raising=False)
    return root


@pytest.mark.parametrize(("m", "name"), [
    ({"gpu_name": "NVIDIA H100 80GB HBM3", "hardware": "NVIDIA H100 80GB HBM3"},
     "nvidia-h100-80gb-hbm3"),
    ({"gpu_name": "NVIDIA L4", "hardware": "2x NVIDIA L4"}, "2x-nvidia-l4"),
    ({"cpu_model": "Intel(R) Xeon(R) Processor @ 2.20GHz", "cpu_cores": 2}, "cpu-intel-xeon-2c"),
    ({"cpu_model": "AMD EPYC 7B13 64-Core Processor", "cpu_cores": 8},
     "cpu-amd-epyc-7b13-64-core-8c"),
    ({"cpu_model": None, "cpu_cores": 4}, "cpu-unknown-4c"),
])
def test_named_from_the_hardware(m: dict, name: str) -> None:
    assert machines.hardware_name(m) == name
    assert name not in COMMITTED_MACHINES  # never a committed reference machine's folder


def test_named_once_and_the_environment_wins(outputs: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from tunebook.core.hardware import machine

    assert machines.name() == machines.hardware_name(machine())
    assert cli(["machine", "--name", "lab-box"]) == 0
    assert "machine: lab-box" in capsys.readouterr().out
    assert machines.name() == "lab-box"  # saved: every later command
    monkeypatch.setenv(machines.MACHINE_ENV, "ci-runner")
    assert machines.name() == "ci-runner"
    assert cli(["machine", "--name", "bad name"]) == 2
    assert "a machine name is a folder name" in capsys.readouterr().err
    with pytest.raises(machines.MachineNameError):
        machines.check_name("..")


def test_experiments_land_in_this_machines_folder(outputs: Path,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(machines.MACHINE_ENV, "box")
    # an older tunebook's experiments at the top: one moved in, one whose name is taken stays
    for name in ("quickstart", "ch01"):
        (outputs / name / "runs").mkdir(parents=True)
        (outputs / name / "runs" / "r.json").write_text("{}")
    (outputs / "box" / "ch01" / "runs").mkdir(parents=True)
    # a reference machine's experiment is left alone
    (outputs / "cpu" / "ch02" / "runs").mkdir(parents=True)
    # a dry run decides the folder and moves nothing
    assert machines.experiments_root(settle=False) == outputs / "box"
    assert (outputs / "quickstart").is_dir()

    assert machines.experiments_root() == outputs / "box"
    assert "moved outputs/quickstart to outputs/box/quickstart" in capsys.readouterr().err
    assert (outputs / "box" / "quickstart" / "runs" / "r.json").read_text() == "{}"
    assert not (outputs / "quickstart").exists()
    assert (outputs / "ch01" / "runs" / "r.json").is_file()  # taken there: not moved
    assert (outputs / "cpu" / "ch02").is_dir()
    said = json.loads((outputs / "box" / machines.MACHINE_JSON).read_text())
    assert said["name"] == "box" and said["hardware"] and "host" not in said
    # the root itself, asked, is the same as nothing asked; any other folder is used as is
    assert machines.experiments_root(outputs) == outputs / "box"
    assert machines.experiments_root(outputs / "cpu") == outputs / "cpu"
    # the overview reads the one left at the top as this machine: one column, not two
    assert overview.machines(outputs) == ["box", "cpu"]
