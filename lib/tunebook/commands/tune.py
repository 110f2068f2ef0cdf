"""`tunebook tune`: the SLO search (tunebook.search.tune)."""

from __future__ import annotations

import argparse
import sys

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command
from tunebook.commands.options import _add_common, _add_wait, _load, _wait
from tunebook.inputs.slo import SEARCH, SLO
from tunebook.results import machines


class TuneCommand(Command):
    name = "tune"
    help = ("the config that serves the most within an SLO: an "
            "adaptive search (exit 0 found, 1 none meets the SLO)")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        _add_common(sp)
        sp.add_argument("--dry-run", action="store_true", help="print the space; start nothing")
        sp.add_argument("-q", "--quiet", action="store_true")
        _add_wait(sp)

    def run(self, args: argparse.Namespace) -> int:
        """The SLO search: exit 0 a config meets the SLO, 1 none does, 2 bad params."""
        from tunebook.search import tune as slo_search

        params = _load(args)
        if not params.section(SLO) or not params.section(SEARCH):
            print(f"tunebook: {args.params}: no slo/search section: nothing to search (see "
                  "params/slo.yaml)", file=sys.stderr)
            return EXIT_BAD_PARAMS
        if args.dry_run:
            print(slo_search.describe(params, machines.experiments_root(args.outputs,
                                                                        settle=False)))
            return EXIT_OK
        _wait(args)
        code, out = slo_search.tune(params, machines.experiments_root(args.outputs),
                                    progress=not args.quiet)
        print(slo_search.report_text(out))
        return code


COMMANDS.add(TuneCommand.name, TuneCommand())
