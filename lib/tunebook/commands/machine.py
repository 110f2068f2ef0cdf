"""`tunebook machine`: this box's machine name, its experiments' folder, its hardware
(tunebook.results.machines)."""

from __future__ import annotations

import argparse
import os
import sys

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command
from tunebook.core import config
from tunebook.results import machines


class MachineCommand(Command):
    name = "machine"
    help = ("this box's machine name and the folder under "
            "outputs/ its experiments land in (named from its "
            "hardware unless named once with --name or "
            "$TUNEBOOK_MACHINE)")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--name", default=None, help="name this machine from now on")

    def run(self, args: argparse.Namespace) -> int:
        """This box's machine: its name, the folder its experiments land in, its hardware."""
        if args.name:
            try:
                machines.save_name(args.name)
            except machines.MachineNameError as e:
                print(f"tunebook: {e}", file=sys.stderr)
                return EXIT_BAD_PARAMS
            if os.environ.get(machines.MACHINE_ENV, args.name) != args.name:
                print(f"tunebook: saved, but ${machines.MACHINE_ENV} names this machine "
                      f"{os.environ[machines.MACHINE_ENV]!r} here and wins", file=sys.stderr)
        d = machines.describe()
        print(f"machine: {d['name']}\nexperiments: {config.outputs_dir() / d['name']}\n"
              f"hardware: {d['hardware']}")
        return EXIT_OK


COMMANDS.add(MachineCommand.name, MachineCommand())
