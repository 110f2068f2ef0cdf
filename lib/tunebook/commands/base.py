"""A subcommand of `tunebook` (asv's layout: one module per command): a `Command` says its
name, its help line and its own options, and runs on the parsed arguments, returning the exit
code. Each registers itself in COMMANDS; tunebook.cli builds its parser from them, in the order
tunebook.commands imports them (the order `tunebook --help` lists them). A new command is one
module in this folder and one line in its __init__.

Exit codes (tunebook.cli's docstring says them to users): 0 all runs ok, 1 some runs failed
(recorded), 2 bad params or bad usage, 3 another sweep holds the experiment or the machine,
4 (--again) worse beyond noise than the last measurement, 130 interrupted (Ctrl-C),
143 terminated (SIGTERM)."""

from __future__ import annotations

import argparse
from abc import ABC, abstractmethod

from tunebook.core.registry import Registry

EXIT_OK, EXIT_FAILED_RUNS, EXIT_BAD_PARAMS, EXIT_LOCKED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + SIGINT / SIGTERM, as shells report them
EXIT_WORSE_THAN_LAST = 4  # --again: worse beyond noise than the last measurement


class Command(ABC):
    name: str = ""  # the subcommand: `tunebook NAME`
    help: str = ""  # its line in `tunebook --help`

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        """The command's own options, on its subparser (none by default)."""
        return None

    @abstractmethod
    def run(self, args: argparse.Namespace) -> int:
        """Do the command; the exit code."""


COMMANDS: Registry[Command] = Registry("command")
