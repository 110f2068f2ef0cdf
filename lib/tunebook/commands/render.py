"""`tunebook render`: (re)render an experiment's executed notebook to HTML."""

from __future__ import annotations

import argparse
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_OK, Command
from tunebook.commands.options import _add_no_input


class RenderCommand(Command):
    name = "render"
    help = "render an experiment's executed notebook to HTML"

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiment_dir", type=Path, help="e.g. outputs/h200/ch04")
        _add_no_input(sp)

    def run(self, args: argparse.Namespace) -> int:
        """(Re)render the HTML report of an experiment's latest executed notebook."""
        from tunebook.present import report

        html = report.to_html(report.latest_notebook(args.experiment_dir), no_input=args.no_input)
        print(f"HTML report: {html}")
        return EXIT_OK


COMMANDS.add(RenderCommand.name, RenderCommand())
