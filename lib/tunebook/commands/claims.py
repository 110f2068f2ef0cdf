"""`tunebook claims`: the claims table of every experiment under a folder
(tunebook.present.claims)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command


class ClaimsCommand(Command):
    name = "claims"
    help = ("the claims table (manual vs measured, with verdicts) "
            "of every experiment under a folder")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("root", type=Path, help="a folder of experiments, e.g. outputs/h200")
        sp.add_argument("--out", type=Path, default=None,
                        help="where claims.{csv,md,html,json} go (default: ROOT)")

    def run(self, args: argparse.Namespace) -> int:
        from tunebook.present import claims
        from tunebook.results.store import find_experiments

        roots = find_experiments(args.root, max_depth=1) if args.root.is_dir() else []
        if not roots:
            print(f"tunebook: no experiment folders (with runs/) under {args.root}",
                  file=sys.stderr)
            return EXIT_BAD_PARAMS
        df = claims.evaluate(roots)
        paths = claims.write(df, args.out or args.root)
        print(claims.to_markdown(df))
        print("written: " + ", ".join(str(p) for p in paths))
        return EXIT_OK


COMMANDS.add(ClaimsCommand.name, ClaimsCommand())
