"""`tunebook sweep`: the sweep alone, no notebook (what the notebook calls)."""

from __future__ import annotations

import argparse

from tunebook.commands.base import COMMANDS, EXIT_OK, Command
from tunebook.commands.options import (
    _add_again,
    _add_common,
    _add_ray,
    _add_wait,
    _again_begin,
    _again_end,
    _load,
    _ray,
    _wait,
)
from tunebook.results import machines


class SweepCommand(Command):
    name = "sweep"
    help = "run the sweep without a notebook"

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        _add_common(sp)
        sp.add_argument("--dry-run", action="store_true")
        sp.add_argument("-q", "--quiet", action="store_true")
        _add_wait(sp)
        _add_ray(sp)
        _add_again(sp)

    def run(self, args: argparse.Namespace) -> int:
        """The sweep alone, no notebook (what the notebook calls)."""
        from tunebook.measure.sweep import Sweep, SweepOptions
        from tunebook.present import index

        _wait(args)  # before the Sweep reads it
        _ray(args)
        sweep = Sweep(_load(args), machines.experiments_root(args.outputs, settle=not args.dry_run),
                      SweepOptions(progress=not args.quiet, on_finish=index.rebuild))
        if args.dry_run:
            print(sweep.describe())
            return EXIT_OK
        again = _again_begin(args, sweep.store.root)
        if again is not None:
            sweep.options.since = again.started
        result = sweep.run()
        print(f"{result.ok} ok, {result.failed} not ok, {result.skipped} already done; "
              f"table: {sweep.store.root / 'results.parquet'}")
        if again is not None:
            changed = _again_end(args, sweep.store.root, again,
                                 {r.run_id for r in sweep.plan.runs})
            return result.exit_code or changed
        return result.exit_code


COMMANDS.add(SweepCommand.name, SweepCommand())
