"""This box's folder of experiments: ``outputs/<machine>/<experiment>``.

The folders committed under outputs/ (cpu, h100, h200) are reference machines measured
elsewhere. Runs on the user's own box gather in one folder of its own, never in those, unless a
command is given ``--outputs`` (then the experiment lands right under that folder, as before).
Its name, the first of:

    TUNEBOOK_MACHINE    set in the environment (a folder name)
    the saved name      `tunebook machine --name NAME`, once (kept in the state folder)
    the hardware        'nvidia-h100-80gb-hbm3', '2x-nvidia-l4', 'cpu-intel-xeon-2c'

Each machine folder holds machine.json (asv's idea: a results folder names its machine once):
the name and the hardware, written when its first experiment lands. Experiments an older
tunebook left right under outputs/ are moved into this box's folder the first time it is used
(one line each says so; a name taken there already leaves the old one where it is, and the
overview reads it as this machine).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from tunebook.core import config
from tunebook.core.files import FOLDER_NAME, replace_atomic

MACHINE_ENV = "TUNEBOOK_MACHINE"
MACHINE_JSON = "machine.json"
_SAVED = "machine-name.json"  # in the state folder (TUNEBOOK_STATE_DIR)
# words that name no machine: "Intel(R) Xeon(R) Processor @ 2.20GHz" -> intel-xeon
_NOISE = re.compile(r"\((?:r|tm)\)|\b(?:cpu|processor|core\(tm\))\b|@.*$", re.IGNORECASE)


class MachineNameError(ValueError):
    pass


def check_name(name: str) -> str:
    if not FOLDER_NAME.fullmatch(name):
        raise MachineNameError(
            f"a machine name is a folder name of letters, digits, '.', '_' and '-' (at most "
            f"64, starting with a letter or digit); got {name!r}")
    return name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def hardware_name(m: dict[str, Any]) -> str:
    """The name the hardware gives (`m`: tunebook.core.hardware.machine())."""
    if m.get("gpu_name"):
        many = re.match(r"(\d+)x ", str(m.get("hardware") or ""))  # "2x NVIDIA L4"
        count = int(many.group(1)) if many else 1
        return (f"{count}x-" if count > 1 else "") + _slug(str(m["gpu_name"]))[:48]
    cpu = _slug(_NOISE.sub(" ", str(m.get("cpu_model") or ""))) or "unknown"
    return f"cpu-{cpu[:40]}-{m.get('cpu_cores') or 0}c"


def _saved_path() -> Path:
    return config.state_dir() / _SAVED


def name() -> str:
    """This box's machine name (the module docstring says from where)."""
    if os.environ.get(MACHINE_ENV):
        return check_name(os.environ[MACHINE_ENV])
    try:
        return check_name(json.loads(_saved_path().read_text())["name"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    from tunebook.core.hardware import machine

    return hardware_name(machine())


def save_name(new: str) -> Path:
    """`tunebook machine --name NEW`: this box's name from now on (the environment's wins)."""
    path = _saved_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    return replace_atomic(path, json.dumps({"name": check_name(new)}).encode())


def describe() -> dict[str, Any]:
    """What machine.json says of this box: the name and the hardware (no host name: the
    folder is shared with reports)."""
    from tunebook.core.hardware import machine

    m = machine()
    keep = ("hardware", "gpu_name", "gpu_memory_gib", "cpu_model", "cpu_cores")
    return {"name": name(), **{k: m.get(k) for k in keep}}


def experiments_root(asked: Path | str | None = None, settle: bool = True) -> Path:
    """Where experiments land: ``asked`` as given (``--outputs``), or this box's folder under
    the outputs root when nothing (or the root itself) is asked; `settle`: that folder made
    ready (machine.json, experiments an older tunebook left at the top moved in), not for a
    dry run."""
    root = config.outputs_dir()
    if asked is not None and Path(asked).expanduser().resolve() != root:
        return Path(asked).expanduser().resolve()
    folder = root / name()
    if settle:
        _settle(root, folder)
    return folder


def _settle(root: Path, folder: Path) -> None:
    from tunebook.results.store import find_experiments

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / MACHINE_JSON).exists():
        replace_atomic(folder / MACHINE_JSON, (json.dumps(describe(), indent=1) + "\n").encode())
    for exp in find_experiments(root):
        if exp.parent != root or (folder / exp.name).exists():
            continue
        exp.rename(folder / exp.name)  # the same file system: nothing copied, nothing lost
        print(f"tunebook: moved {root.name}/{exp.name} to {root.name}/{folder.name}/{exp.name} "
              "(this machine's folder)", file=sys.stderr)


def label_of(folder: Path) -> str | None:
    """The hardware a machine folder's machine.json names, if it has one."""
    try:
        return json.loads((folder / MACHINE_JSON).read_text()).get("hardware")
    except (OSError, ValueError, AttributeError):
        return None


__all__ = ["MACHINE_ENV", "MACHINE_JSON", "MachineNameError", "check_name", "describe",
           "experiments_root", "hardware_name", "label_of", "name", "save_name"]
