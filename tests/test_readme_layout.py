"""README's "Layout" table and the package lib/tunebook are in step.

The table (in the README section headed `## Layout`) has one row per folder of the package, or
per top-level module. The first cell is the row's path relative to lib/tunebook, in code font:
`core/`, `measure/executors/`, `data/`, `cli.py`. In a folder's row, every other code span that is
a module file name (`config.py`) names a module of that folder; anything else in code font
(`tunebook tune`, `TUNEBOOK_*`) is ignored. A row whose first cell is not in code font (the
header, the `|---|` line) is skipped, and so is everything outside the table's rows.

Checked both ways: every folder under lib/tunebook (subpackages and data folders; not
__pycache__) and every module (*.py but __init__.py) is named in the table, and everything the
table names exists. Reads files only: nothing is imported, no engine starts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PKG = ROOT / "lib" / "tunebook"
SECTION = "## Layout"

_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.py")
_CODE = re.compile(r"`([^`]+)`")


def _cells(row: str) -> list[str]:
    """A markdown table row's cells; a `|` inside a code span does not split."""
    cells, cell, in_code = [], [], False
    for ch in row.strip().strip("|"):
        if ch == "`":
            in_code = not in_code
        if ch == "|" and not in_code:
            cells.append("".join(cell).strip())
            cell = []
        else:
            cell.append(ch)
    cells.append("".join(cell).strip())
    return cells


def section_lines(text: str) -> list[str]:
    """The lines of the README's Layout section, fenced code blocks left out."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == SECTION)
    except StopIteration:
        pytest.fail(f"README.md has no {SECTION!r} section (a line that is exactly {SECTION!r})")
    out, fenced = [], False
    for line in lines[start + 1:]:
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            continue
        if line.startswith("## "):
            break
        out.append(line)
    return out


def readme_entries(text: str) -> list[str]:
    """Every path the Layout table names, relative to lib/tunebook: folders end in `/`."""
    entries: list[str] = []
    for line in section_lines(text):
        if not line.lstrip().startswith("|"):
            continue
        cells = _cells(line)
        first = _CODE.fullmatch(cells[0])
        if first is None:
            continue  # the header or the |---| line
        path = first.group(1).strip()
        if path.endswith(".py"):
            entries.append(path)
        elif path.endswith("/"):
            entries.append(path)
            entries += [path + name for cell in cells[1:] for name in _CODE.findall(cell)
                        if _MODULE.fullmatch(name)]
        else:
            pytest.fail(f"README.md {SECTION}: a row's first cell must be a folder (`name/`) or a "
                        f"top-level module (`name.py`) in code font, got {cells[0]!r} in:\n{line}")
    return entries


def package_entries(root: Path = PKG) -> set[str]:
    """Every folder (with a trailing `/`) and module (*.py but __init__.py) under lib/tunebook."""
    found: set[str] = set()
    for path in root.rglob("*"):
        rel = path.relative_to(root)
        if any(p == "__pycache__" or p.startswith(".") or p.endswith(".egg-info")
               for p in rel.parts):
            continue
        if path.is_dir():
            found.add(rel.as_posix() + "/")
        elif path.suffix == ".py" and path.name != "__init__.py":
            found.add(rel.as_posix())
    return found


@pytest.fixture(scope="module")
def named() -> list[str]:
    entries = readme_entries(README.read_text(encoding="utf-8"))
    if not entries:
        pytest.fail(f"README.md {SECTION}: no table rows found; each row must start with the "
                    f"folder in code font, e.g. | `core/` | ... `config.py` what it does ... |")
    return entries


def _listing(paths: set[str]) -> str:
    return "\n".join(f"  lib/tunebook/{p}" for p in sorted(paths))


def test_table_names_each_path_once(named: list[str]) -> None:
    twice = {p for p in named if named.count(p) > 1}
    assert not twice, f"README.md {SECTION} names these more than once:\n{_listing(twice)}"


def test_every_folder_and_module_is_in_the_readme(named: list[str]) -> None:
    missing = package_entries() - set(named)
    assert not missing, (
        f"lib/tunebook has these, but README.md's {SECTION} table does not name them (add a "
        f"folder as its own row, a module as `name.py` plus what it does in its folder's "
        f"row):\n{_listing(missing)}")


def test_everything_the_readme_names_exists(named: list[str]) -> None:
    missing = set(named) - package_entries()
    assert not missing, (
        f"README.md's {SECTION} table names these, but lib/tunebook has no such folder or "
        f"module (create it, or fix the table):\n{_listing(missing)}")


def test_parser_reads_the_format() -> None:
    text = "\n".join([
        "# x", "## Layout", "intro with `other.py` outside the table",
        "| folder | modules |", "|---|---|",
        "| `core/` | Read by all. `config.py` paths · `schema.py` the row, `tunebook tune` |",
        "| `measure/executors/` | `local.py` here · `ray_cluster.py` `--ray` |",
        "| `cli.py` | the `tunebook` command |",
        "```", "| `fenced/` | `ignored.py` |", "```",
        "## Next", "| `after/` | `ignored.py` |",
    ])
    assert readme_entries(text) == [
        "core/", "core/config.py", "core/schema.py",
        "measure/executors/", "measure/executors/local.py", "measure/executors/ray_cluster.py",
        "cli.py"]
