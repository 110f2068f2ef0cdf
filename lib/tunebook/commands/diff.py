"""`tunebook diff`: what changed between two sets of runs beyond noise
(tunebook.present.diff)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, Command


class DiffCommand(Command):
    name = "diff"
    help = ("what changed between two sets of runs (two "
            "experiments, two vLLM versions or two dates) beyond noise: "
            "exit 0 nothing worse, 1 worse, 2 nothing comparable")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("old", type=Path, help="an experiment folder")
        sp.add_argument("new", type=Path, nargs="?", default=None,
                        help="an experiment folder (default: OLD, narrowed by the --new-* options)")
        for s in ("old", "new"):
            sp.add_argument(f"--{s}-version", default=None, help=f"only the {s} side's runs "
                                                                  "served by this vLLM version")
            sp.add_argument(f"--{s}-config", default=None, help="only this engine config "
                                                                 "(label or engine_config_id)")
            sp.add_argument(f"--{s}-since", default=None, help="runs started at or after this "
                                                                "UTC ISO time")
            sp.add_argument(f"--{s}-until", default=None, help="runs started before this UTC "
                                                                "ISO time")
        sp.add_argument("--metric", action="append", default=None,
                        help="a metric to compare (repeatable; default: throughput, TTFT, TPOT, "
                             "ITL, goodput, energy and cost where present)")
        sp.add_argument("--worse-than", type=float, default=0.0, metavar="PCT",
                        help="exit 1 only for a change worse beyond noise by more than PCT "
                             "percent (default 0: any)")
        sp.add_argument("--html", type=Path, default=None, help="also write the page here")
        sp.add_argument("--json", type=Path, default=None,
                        help="also write a small JSON summary (exit code, counts, what got worse)")

    def run(self, args: argparse.Namespace) -> int:
        """What changed between two sets of runs beyond noise; exit 0 nothing worse (beyond
        --worse-than percent), 1 something worse, 2 bad input or nothing comparable."""
        import json

        from tunebook.present import diff

        sides = [diff.Side(root, getattr(args, f"{s}_version"), getattr(args, f"{s}_config"),
                           getattr(args, f"{s}_since"), getattr(args, f"{s}_until"))
                 for s, root in (("old", args.old), ("new", args.new or args.old))]
        try:
            table, figs = diff.run(*sides, metrics=args.metric)
        except diff.DiffError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return diff.EXIT_BAD
        except KeyError as e:
            print(f"tunebook: no metric {e}; known: {', '.join(diff.METRICS)}", file=sys.stderr)
            return diff.EXIT_BAD
        print(diff.text(table, figs, sides[0].name, sides[1].name))
        code = diff.exit_code(table, args.worse_than)
        if args.html:
            args.html.write_text(diff.to_html(table, figs, sides[0].name, sides[1].name))
            print(f"page: {args.html}")
        if args.json:
            args.json.write_text(json.dumps({"old": sides[0].name, "new": sides[1].name,
                                             **diff.summary(table, figs, args.worse_than)},
                                            indent=1, default=str))
        return code


COMMANDS.add(DiffCommand.name, DiffCommand())
