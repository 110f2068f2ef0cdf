"""`tunebook deploy`: an engine config as vLLM's config file, container arguments and
Helm values (tunebook.present.export)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tunebook.commands.base import COMMANDS, EXIT_BAD_PARAMS, EXIT_FAILED_RUNS, EXIT_OK, Command


class DeployCommand(Command):
    name = "deploy"
    help = ("an engine config (the SLO search's answer unless "
            "--config names one) as vLLM's config file (vllm serve "
            "--config), container arguments and Helm values")

    def add_arguments(self, sp: argparse.ArgumentParser) -> None:
        sp.add_argument("experiment_dir", type=Path)
        sp.add_argument("--config", default=None, help="an engine_config_id or its label")
        sp.add_argument("--out", type=Path, default=None,
                        help="default: EXPERIMENT_DIR/deploy/ENGINE_CONFIG_ID")
        sp.add_argument("--prove", action="store_true",
                        help="start vLLM here from the config file and check each knob took "
                             "effect (its start-up log, /metrics)")

    def run(self, args: argparse.Namespace) -> int:
        """An engine config of an experiment (the SLO search's answer unless --config names one)
        as vLLM's config file, container arguments and Helm values; --prove starts vLLM from the
        file here and checks each knob took effect."""
        from tunebook.models.presets import resolve_model
        from tunebook.present import export

        try:
            answer = export.pick(args.experiment_dir, args.config)
        except export.ExportError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        out = args.out or args.experiment_dir / "deploy" / answer.engine_config_id
        for path in export.write(answer, out):
            print(path)
        if not args.prove:
            return EXIT_OK
        checks = export.prove(answer, out / export.FILES[0], resolve_model(answer.model),
                              out / "prove.log", answer.env)
        for knob, c in checks.items():
            seen = c["log"] if "metrics" not in c else f"{c['log']} (/metrics: {c['metrics']})"
            print(f"{'ok ' if c['ok'] else 'NOT'} {knob}: asked {c['asked']}, vLLM took {seen}")
        return EXIT_OK if all(c["ok"] for c in checks.values()) else EXIT_FAILED_RUNS


COMMANDS.add(DeployCommand.name, DeployCommand())
