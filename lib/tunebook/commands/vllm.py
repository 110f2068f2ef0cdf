"""`tunebook vllm`: vLLM releases beside the installed one (tunebook.servers.versions)."""

from __future__ import annotations

import argparse
import sys

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_OK, Command


class VllmCommand(Command):
    name = "vllm"
    help = ("vLLM releases installed beside this one, for the "
            "`vllm` engine knob (engine_grid: [{}, {vllm: \"0.31.0\"}])")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("action", nargs="?", choices=("list", "add", "remove"), default="list")
        sp.add_argument("versions", nargs="*", metavar="VERSION", help="e.g. 0.31.0")

    def run(self, args: argparse.Namespace) -> int:
        """vLLM releases beside the installed one (tunebook.servers.versions): list, add, remove."""
        from tunebook.servers import versions

        dist, current = versions.installed()
        if args.action == "add":
            try:
                for v in args.versions:
                    if v != current:
                        versions.add(v)
            except versions.VersionError as e:
                print(f"tunebook: {e}", file=sys.stderr)
                return EXIT_BAD_PARAMS
        elif args.action == "remove":
            for v in args.versions:
                print(f"vLLM {v}: {'removed' if versions.remove(v) else 'not installed beside'}")
            return EXIT_OK
        print(f"{dist} {current}: installed (tunebook runs on it)")
        for info in versions.listed():
            extra = ", ".join(f"{k} {v}" for k, v in info["packages"].items()
                              if k != info["distribution"])
            print(f"{info['distribution']} {info['version']}: beside it in "
                  f"{versions.folder(info['version'])} ({info['bytes'] / 2**20:,.0f} MiB; "
                  f"with {extra or 'nothing else'})")
        return EXIT_OK


COMMANDS.add(VllmCommand.name, VllmCommand())
