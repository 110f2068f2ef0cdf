"""`tunebook` command line. Exit codes: 0 all runs ok, 1 some runs failed (recorded),
2 bad params or bad usage, 3 another sweep holds the experiment or the machine,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn

from tunebook.commands import COMMANDS
from tunebook.commands.base import (  # noqa: F401  (the exit codes, as callers import them)
    EXIT_BAD_PARAMS,
    EXIT_FAILED_RUNS,
    EXIT_INTERRUPTED,
    EXIT_LOCKED,
    EXIT_OK,
    EXIT_TERMINATED,
    EXIT_WORSE_THAN_LAST,
)
from tunebook.core import config
from tunebook.core.schema import SchemaVersionError
from tunebook.inputs import params as P
from tunebook.models.presets import ModelNotFoundError
from tunebook.servers import sglang as peer

# The subcommands live in tunebook.commands, one module each; they import the heavy modules
# they need (sweep, report, claims: pandas, altair, papermill) themselves, so `tunebook --help`
# and a bad-params error answer at once.


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tunebook", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for c in COMMANDS:
        sp = sub.add_parser(c.name, help=c.help)
        c.add_arguments(sp)
        sp.set_defaults(fn=c.run)
    return ap


def main(argv: list[str] | None = None) -> int:
    from tunebook.measure.locks import SweepLockedError, Terminated
    from tunebook.measure.supply import DeadlineNear

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (P.ParamsError, ModelNotFoundError, SchemaVersionError,
            peer.EngineNotInstalledError, config.EnvError) as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    except SweepLockedError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except BrokenPipeError:  # `tunebook plan … | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # what a shell reports for SIGPIPE
    except OSError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    except KeyboardInterrupt:
        print("tunebook: interrupted; finished runs are saved — run again to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as e:
        print(f"tunebook: {e}" if isinstance(e, DeadlineNear) else
              "tunebook: terminated (SIGTERM); finished runs are saved — run again to resume",
              file=sys.stderr)
        return EXIT_TERMINATED


def _quiet_exit(code: int) -> NoReturn:
    """Exit as Python would, minus the interpreter's teardown when triton's compiled module is
    loaded (vLLM imports it): at teardown its nanobind bindings print dozens of "leaked
    function" lines that say nothing about the command. Everything that can still matter runs
    first, as at a normal exit: non-daemon threads are joined, atexit handlers run (engines
    stopped, logs flushed; an error in one is printed), stdout and stderr are flushed."""
    if "triton._C.libtriton" not in sys.modules:
        sys.exit(code)
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def entry() -> NoReturn:
    """The `tunebook` command (`main` returns its exit code, for callers in-process)."""
    _quiet_exit(main())


if __name__ == "__main__":
    entry()
