"""`tunebook history`: an experiment's dated measurements as one page
(tunebook.present.history)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_OK, Command


class HistoryCommand(Command):
    name = "history"
    help = ("an experiment's dated measurements (--again): each "
            "metric over time, steps beyond noise marked with "
            "what changed")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiment_dir", type=Path)
        sp.add_argument("--out", type=Path, default=None,
                        help="default: EXPERIMENT_DIR/history.html")

    def run(self, args: argparse.Namespace) -> int:
        """An experiment's dated measurements as one page: each metric over time, steps marked."""
        from tunebook.present import history

        text, found = history.page(args.experiment_dir)
        out = args.out or args.experiment_dir / "history.html"
        out.write_text(text)
        for s in found:
            print(f"step: {s.metric} at {s.load}, into {s.at}: {s.ratio:.3f}× ({s.verdict}); "
                  f"what changed: {s.what_changed}")
        print(f"{len(found)} step(s) beyond noise; page: {out}")
        return EXIT_OK


COMMANDS.add(HistoryCommand.name, HistoryCommand())
