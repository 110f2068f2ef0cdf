"""The `tunebook` subcommands, one module each (asv's layout), each registering its `Command` in
COMMANDS (tunebook.commands.base). The imports below are the registration list: their order
is the order `tunebook --help` lists the commands in (hence kept out of import sorting)."""

from tunebook.commands.base import COMMANDS, Command

# isort: off
from tunebook.commands import run, plan, sweep, tune, render  # noqa: F401
from tunebook.commands import claims, index, machine, compare, export  # noqa: F401
from tunebook.commands import deploy, diff, history, pack, engines, vllm, compact  # noqa: F401
# isort: on

__all__ = ["COMMANDS", "Command"]
