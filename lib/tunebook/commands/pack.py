"""`tunebook pack` and `tunebook unpack`: an experiment as one checked .tar.gz, and back
(tunebook.results.archive)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command
from tunebook.core import config


class PackCommand(Command):
    name = "pack"
    help = ("an experiment as one .tar.gz with a manifest (each "
            "file's size and SHA-256), to carry to another machine")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiment_dir", type=Path, help="e.g. outputs/h200/ch04")
        sp.add_argument("--out", type=Path, default=None,
                        help="the file to write (default: "
                             "<machine>-<experiment>__<utc>.tar.gz here)")
        sp.add_argument("--outputs", type=Path, default=None,
                        help="the outputs root the experiment's name is relative to (default: "
                             "$TUNEBOOK_OUTPUTS or outputs/)")

    def run(self, args: argparse.Namespace) -> int:
        """One experiment as a verified .tar.gz, to carry between machines."""
        from tunebook.results import archive

        try:
            out = archive.pack(args.experiment_dir, args.out, args.outputs)
        except archive.ArchiveError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        with archive.verified(out) as pack:  # read back: what was written is what will unpack
            files = pack.manifest.files
            print(f"packed {pack.manifest.experiment}: {len(files)} files, "
                  f"{sum(e.size_bytes for e in files) / 1e6:.1f} MB "
                  f"({out.stat().st_size / 1e6:.1f} MB packed) -> {out}")
        return EXIT_OK


COMMANDS.add(PackCommand.name, PackCommand())


class UnpackCommand(Command):
    name = "unpack"
    help = ("check a pack in full, then add its files to an outputs "
            "folder: files already there are kept, never replaced")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("archive", type=Path, help="a file `tunebook pack` wrote")
        sp.add_argument("--outputs", type=Path, default=None,
                        help="the outputs root (default: $TUNEBOOK_OUTPUTS or outputs/)")

    def run(self, args: argparse.Namespace) -> int:
        """Check a pack in full, then add its files to an outputs folder (local files kept)."""
        from tunebook.results import archive

        try:
            done = archive.unpack(args.archive, args.outputs or config.outputs_dir())
        except archive.ArchiveError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        print(done.summary())
        return EXIT_OK


COMMANDS.add(UnpackCommand.name, UnpackCommand())
