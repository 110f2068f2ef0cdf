"""`tunebook export`: an experiment's charts as PNG and SVG, or its report as one PDF."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command


def _export_pdf(target: Path, out: Path | None) -> int:
    """An experiment's report.html (or any page tunebook wrote, e.g. outputs/overview.html)
    printed by headless Chromium to PDF beside it: report.pdf, overview.pdf."""
    from tunebook.present import browser, report

    page = target if target.suffix == ".html" else target / report.REPORT
    if not page.is_file():
        print(f"tunebook: no {page}: render the report first (tunebook render {target})",
              file=sys.stderr)
        return EXIT_BAD_PARAMS
    try:
        pdf = browser.print_pdf(page, out or page.with_suffix(".pdf"))
    except ImportError as e:  # selenium missing
        print(f"tunebook: printing to PDF needs selenium ({e})", file=sys.stderr)
        return EXIT_BAD_PARAMS
    print(pdf)
    return EXIT_OK


class ExportCommand(Command):
    name = "export"
    help = ("write every chart of an experiment's latest notebook "
            "as PNG and SVG (vl-convert), or with --pdf its report "
            "as one PDF")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiment_dir", type=Path,
                        help="an experiment folder; with --pdf also a page such as "
                             "outputs/overview.html")
        sp.add_argument("--out", type=Path, default=None,
                        help="default: EXPERIMENT_DIR/charts; with --pdf, "
                             "EXPERIMENT_DIR/report.pdf")
        sp.add_argument("--format", action="append", default=None, choices=["png", "svg", "pdf"])
        sp.add_argument("--pdf", action="store_true",
                        help="print the report (report.html) to report.pdf with headless Chromium "
                             "instead, every folded reasoning unfolded")

    def run(self, args: argparse.Namespace) -> int:
        """Every chart of an experiment's latest notebook as PNG and SVG (for slides); with
        --pdf, its report printed to PDF instead."""
        from tunebook.present import report

        if args.pdf:
            return _export_pdf(args.experiment_dir, args.out)
        paths = report.export_charts(report.latest_notebook(args.experiment_dir),
                                     args.out or args.experiment_dir / "charts", args.format)
        for p in paths:
            print(p)
        return EXIT_OK


COMMANDS.add(ExportCommand.name, ExportCommand())
