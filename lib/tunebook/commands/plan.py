"""`tunebook plan`: what would run (a dry run)."""

from __future__ import annotations

import argparse

from tunebook.commands.base import COMMANDS, EXIT_OK, Command
from tunebook.commands.options import _add_common, _describe, _load
from tunebook.results import machines


class PlanCommand(Command):
    name = "plan"
    help = "print what would run (a dry run)"

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        _add_common(sp)

    def run(self, args: argparse.Namespace) -> int:
        print(_describe(_load(args), machines.experiments_root(args.outputs, settle=False)))
        return EXIT_OK


COMMANDS.add(PlanCommand.name, PlanCommand())
