"""The recipes of docs/scheduling.md (a crontab line, a systemd unit, a CI workflow) call
tunebook with flags that exist and params that parse: each command line is read out of the
page and handed to tunebook's own parser, then planned (a dry run: nothing starts)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tunebook import cli

REPO = Path(__file__).resolve().parents[1]
PAGE = REPO / "docs" / "scheduling.md"


def _commands() -> dict[str, list[str]]:
    text = PAGE.read_text()
    found = {}
    cron = re.search(r"^30 2 \* \* \*\s+(.*)$", text, re.M)
    found["cron"] = cron.group(1) if cron else ""
    unit = re.search(r"^ExecStart=((?:[^\n]*\\\n)*[^\n]*)", text, re.M)
    found["systemd"] = unit.group(1).replace("\\\n", " ") if unit else ""
    ci = re.search(r"^\s+- run: (cd /srv/tunebook && .*tunebook run.*)$", text, re.M)
    found["ci"] = ci.group(1) if ci else ""
    out = {}
    for name, line in found.items():
        assert line, f"no {name} recipe in {PAGE.name}"
        words = shlex.split(line.split(">>")[0].split("||")[0].replace("\\%", "%"))
        start = next(i for i, w in enumerate(words) if w.endswith("bin/tunebook"))
        out[name] = words[start + 1:]
    return out


@pytest.mark.parametrize("name", ["cron", "systemd", "ci"])
def test_each_recipe_runs_a_real_tunebook_command(name: str, tmp_path: Path) -> None:
    argv = _commands()[name]
    args = cli.build_parser().parse_args(argv)
    assert args.cmd == "run" and args.again, argv  # a dated measurement each time
    assert (REPO / args.params).is_file()
    # as far as this machine allows: the same command, planned here (a dry run starts nothing)
    i = argv.index("--outputs")
    here = [*argv[:i], "--outputs", str(tmp_path), *argv[i + 2:], "--dry-run"]
    here[here.index(str(args.params))] = str(REPO / args.params)
    assert cli.main(here) == cli.EXIT_OK
