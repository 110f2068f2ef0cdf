"""`tunebook index`: rebuild outputs/index.html (tunebook.present.index)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command
from tunebook.commands.options import _index
from tunebook.core import config
from tunebook.results import machines


class IndexCommand(Command):
    name = "index"
    help = ("rebuild outputs/index.html (every experiment, with "
            "links and headline numbers)")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("outputs", type=Path, nargs="?", default=None,
                        help="the outputs folder (default: $TUNEBOOK_OUTPUTS or outputs/)")
        sp.add_argument("--outputs", type=Path, dest="outputs_opt", default=None,
                        help="the same, as the other commands spell it")

    def run(self, args: argparse.Namespace) -> int:
        asked = args.outputs or args.outputs_opt
        if asked is None:
            machines.experiments_root()  # this box's folder settled: an older tunebook's moved in
        return EXIT_OK if _index(asked or config.outputs_dir()) else EXIT_BAD_PARAMS


COMMANDS.add(IndexCommand.name, IndexCommand())
