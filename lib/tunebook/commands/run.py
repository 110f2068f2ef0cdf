"""`tunebook run`: validate, then execute the params' notebook with papermill and render
its HTML."""

from __future__ import annotations

import argparse
import sys

from tunebook.commands.base import (
    COMMANDS,
    EXIT_BAD_PARAMS,
    EXIT_FAILED_RUNS,
    EXIT_LOCKED,
    EXIT_OK,
    Command,
)
from tunebook.commands.options import (
    _add_again,
    _add_common,
    _add_no_input,
    _add_ray,
    _add_wait,
    _again_begin,
    _again_end,
    _describe,
    _index,
    _load,
    _overrides,
    _ray,
    _wait,
)
from tunebook.models.presets import resolve_model
from tunebook.results import machines


class RunCommand(Command):
    name = "run"
    help = "execute the params' notebook with papermill, render HTML"

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        _add_common(sp)
        sp.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
        sp.add_argument("--replot", action="store_true",
                        help="execute the notebook on the stored results only (its dry_run): "
                             "figures and claims redrawn by this code, no engine started — e.g. "
                             "for results brought back from a GPU box")
        sp.add_argument("-q", "--quiet", action="store_true")
        _add_wait(sp)
        _add_ray(sp)
        _add_no_input(sp)
        _add_again(sp)

    def run(self, args: argparse.Namespace) -> int:
        """Validate, then execute the params' notebook with papermill and render its HTML."""
        from tunebook.measure.sweep import Sweep, SweepOptions
        from tunebook.present import report
        from tunebook.results.store import not_ok_rows

        _ray(args)  # in the environment: the papermill kernel's sweep reads it
        params = _load(args)
        outputs = machines.experiments_root(args.outputs, settle=not args.dry_run)
        if args.dry_run:
            print(_describe(params, outputs))
            return EXIT_OK
        sweep = Sweep(params, outputs, SweepOptions(progress=False))
        if args.replot and sweep.plan.runs and not sweep.store.rows():
            print(f"tunebook: --replot needs stored runs; {sweep.store.root} has none",
                  file=sys.stderr)
            return EXIT_BAD_PARAMS
        if not args.replot and not params.figures_only:
            resolve_model(params.model)  # builds a preset's folder before papermill starts a kernel
        sweep.store.check_writable()
        try:  # `run` executes the chapter notebook; a machine without papermill can still measure
            from papermill.exceptions import PapermillExecutionError
        except ImportError:
            print("tunebook: `run` executes the notebook with papermill, which is not installed "
                  "here: `tunebook sweep PARAMS` measures the same runs without it (render the "
                  "notebook later, on a machine that has it, with `tunebook run … --replot`)",
                  file=sys.stderr)
            return EXIT_BAD_PARAMS
        _wait(args)
        again = None if args.replot else _again_begin(args, sweep.store.root)

        crashed = None
        try:
            ipynb = report.execute(params.notebook, sweep.store.root, {
                "params_file": str(args.params.resolve()),
                "overrides": _overrides(args.param),
                "outputs": str(outputs),
                "interactive": False,  # the tuning notebook runs its params instead of waiting
                **({"dry_run": True} if args.replot else {}),
            }, progress=not args.quiet, replot=args.replot)
        except PapermillExecutionError as e:  # the partial notebook is saved: render it anyway
            crashed = e
            ipynb = report.latest_notebook(sweep.store.root)
            print(f"tunebook: the notebook stopped at cell {e.exec_count}: {e.ename}: {e.evalue}",
                  file=sys.stderr)
        df = sweep.store.table()
        failed = len(not_ok_rows(df))
        print(f"executed notebook: {ipynb}")
        print(f"results: {sweep.store.root / 'results.parquet'}  ({len(df)} runs, {failed} not ok)")
        try:
            html = report.to_html(ipynb, no_input=args.no_input)
        except ImportError as e:  # nbconvert absent (the device): render later with `render`
            print(f"HTML not rendered here ({e}); run: tunebook render {sweep.store.root}")
        else:
            print(f"HTML report: {html}")
            _index(outputs)
        if crashed is not None and crashed.ename == "SweepLockedError":
            return EXIT_LOCKED
        changed = EXIT_OK if again is None else _again_end(
            args, sweep.store.root, again, {r.run_id for r in sweep.plan.runs})
        return EXIT_FAILED_RUNS if failed or crashed else changed


COMMANDS.add(RunCommand.name, RunCommand())
