"""`tunebook compact`: experiments stored compact, in place (tunebook.results.compact)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import (
    COMMANDS,
    EXIT_BAD_PARAMS,
    EXIT_FAILED_RUNS,
    EXIT_LOCKED,
    EXIT_OK,
    Command,
)


class CompactCommand(Command):
    name = "compact"
    help = ("store experiments compact, in place: each run's "
            "per-request arrays in a Parquet file beside its JSON, "
            "engine logs gzipped (each proven equal first), "
            "notebooks' chart SVG copies dropped where the chart's "
            "spec redraws them exactly, reports' unusable CSS "
            "dropped")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("folders", type=Path, nargs="+", metavar="FOLDER",
                        help="an experiment, or a folder of them (e.g. outputs/h200)")

    def run(self, args: argparse.Namespace) -> int:
        """Convert experiments written inline, in place (tunebook.results.compact): each under
        its experiment lock, as a sweep takes it; the logs of engines still running left plain;
        each saved notebook's chart SVG copies dropped where the spec redraws them byte for byte;
        report.html without the CSS it cannot use (tunebook.present.slim_css).
        Exit 0 done (or nothing left to do), 1 some file left as it was, 3 an experiment locked."""
        from tunebook.measure.locks import SweepLockedError, experiment_lock
        from tunebook.present import report
        from tunebook.results import compact
        from tunebook.results.store import Store, find_experiments
        from tunebook.servers import process

        missing = [str(r) for r in args.folders if not Path(r).is_dir()]
        if missing:
            print(f"tunebook: no such folder: {', '.join(missing)}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        experiments = [e for root in args.folders for e in find_experiments(root)]
        if not experiments:
            print(f"tunebook: no experiment folders (with runs/) under "
                  f"{', '.join(map(str, args.folders))}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        live = [Path(str(e.get("log"))) for e in process.list_engines() if e.get("log")]
        code = EXIT_OK
        for exp in experiments:
            try:
                with experiment_lock(exp):
                    done = compact.convert_experiment(exp, live)
                    if done.records:
                        Store(exp).rebuild_table()  # its rows now say schema 2
                    notebooks = sorted((exp / "notebooks").glob("*.ipynb"))
                    saved = [report.drop_chart_copies(nb) for nb in notebooks]
                    page = report.report_path(exp)
                    css_saved = report.slim_report(page) if page.is_file() else 0
            except SweepLockedError as e:
                print(f"tunebook: {e}; left as it was", file=sys.stderr)
                code = EXIT_LOCKED
                continue
            print(done.text())
            if any(saved):
                print(f"  notebooks: chart SVG copies dropped from {sum(map(bool, saved))} of "
                      f"{len(saved)} (−{sum(saved) / 1e6:.1f} MB; report.html draws them)")
            if css_saved:
                print(f"  report.html: CSS it cannot use dropped (−{css_saved / 1e3:.0f} kB)")
            if done.problems and code == EXIT_OK:
                code = EXIT_FAILED_RUNS
        return code


COMMANDS.add(CompactCommand.name, CompactCommand())
