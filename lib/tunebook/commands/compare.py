"""`tunebook compare`: experiments overlaid, one chart per metric
(tunebook.present.compare)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command


class CompareCommand(Command):
    name = "compare"
    help = ("overlay two or more experiments in one chart per "
            "metric (an offline HTML page)")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiments", type=Path, nargs="+", help="experiment folders")
        sp.add_argument("--label", action="append", default=None,
                        help="a label per experiment, in order (default: their paths)")
        sp.add_argument("--out", type=Path, required=True, help="the HTML file to write")

    def run(self, args: argparse.Namespace) -> int:
        from tunebook.present import compare

        if len(args.experiments) < 2:
            print("tunebook: compare needs two or more experiment folders", file=sys.stderr)
            return EXIT_BAD_PARAMS
        try:
            out = compare.write(args.experiments, args.out, args.label)
        except (ValueError, FileNotFoundError) as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        print(f"comparison: {out}")
        return EXIT_OK


COMMANDS.add(CompareCommand.name, CompareCommand())
