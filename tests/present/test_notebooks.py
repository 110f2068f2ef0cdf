"""Notebooks are committed clean, with exactly one typed `parameters` cell, from the generator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))


def test_generator_matches_committed_notebooks() -> None:
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "make_notebooks.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_clean_with_one_parameters_cell(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    tagged = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1
    src = tagged[0].source
    for name in ("params_file: str", "overrides: dict", "outputs: str", "dry_run: bool"):
        assert name in src
    for c in nb.cells:
        if c.cell_type == "code":
            assert not c.outputs and c.execution_count is None
    # notebooks narrate and call: no cell defines functions or classes
    assert not any(c.source.lstrip().startswith(("def ", "class ")) for c in nb.cells)


def test_every_params_file_names_an_existing_notebook() -> None:
    import yaml

    names = {p.stem for p in NOTEBOOKS}
    for p in sorted((REPO / "params").glob("*.yaml")):
        nb = yaml.safe_load(p.read_text()).get("notebook", "00_quickstart")
        assert nb in names, f"{p.name}: notebook {nb!r} not in notebooks/"
