"""`tunebook engines`: engines tunebook left running (--reap: those whose owner is gone),
or the start-up phases of stored engine starts."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command


class EnginesCommand(Command):
    name = "engines"
    help = ("list engines tunebook left running; --reap kills "
            "those whose owner is gone")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--reap", action="store_true")
        sp.add_argument("--phases", type=Path, nargs="+", metavar="EXPERIMENT_DIR",
                        help="instead: the start-up phases of every engine start stored under "
                             "these folders (an experiment, or e.g. outputs/h200)")

    def run(self, args: argparse.Namespace) -> int:
        from tunebook.servers import process
        from tunebook.servers.shm import reap_shared_memory

        if args.phases:
            from tunebook.results.store import Store, find_experiments
            from tunebook.servers import start_phases

            missing = [str(r) for r in args.phases if not Path(r).is_dir()]
            if missing:
                print(f"tunebook: no such folder: {', '.join(missing)}", file=sys.stderr)
                return EXIT_BAD_PARAMS
            for root in args.phases:
                for exp in find_experiments(root) or [root]:
                    frame = start_phases.phases_frame(list(Store(exp).records(requests=False)),
                                                      exp)
                    print(f"== {exp}: where each engine start's time went (seconds, ± 1)")
                    print(start_phases.table_text(frame))
            return EXIT_OK
        if args.reap:
            print(f"reaped process groups: {process.reap_orphans() or 'none'}")
            shm = reap_shared_memory()
            print(f"removed shared-memory segments dead engines left: {len(shm) or 'none'}")
        live = process.list_engines()
        for info in live:
            print(f"pgid {info['pgid']}  port {info['port']}  owner pid {info['owner_pid']}  "
                  f"log {info['log']}")
        if not live:
            print("no tunebook engine is running")
        return EXIT_OK


COMMANDS.add(EnginesCommand.name, EnginesCommand())
