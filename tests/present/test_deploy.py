"""An answer you can deploy (tunebook deploy, tunebook.present.export): the SLO search's answer
of a stored experiment as vLLM's config file, container arguments and Helm values, each the
same knobs as vLLM's own config reader makes of the file; and a file proven by starting vLLM
from it (`--config`) on CPU and finding each knob in its start-up log and /metrics."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunebook.cli import main as cli
from tunebook.models.presets import resolve_model
from tunebook.present import export

REPO = Path(__file__).resolve().parents[2]
SEARCHED = REPO / "outputs" / "cpu" / "slo-trace"  # a committed CPU search and its answer


def _vllm_reads(config: Path) -> list[str]:
    """The flags vLLM's own argument parser makes of a config file."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return EngineArgs.add_cli_args(FlexibleArgumentParser()).load_config_file(str(config))


def test_the_search_answer_in_three_forms_with_the_same_knobs(tmp_path: Path) -> None:
    best = json.loads(sorted((SEARCHED / "search").glob("*.json"))[-1].read_text())["best"]
    assert cli(["deploy", str(SEARCHED), "--out", str(tmp_path)]) == 0
    config, args, helm = (tmp_path / f for f in export.FILES)
    body = yaml.safe_load(config.read_text())
    assert body["model"] == export.MODEL
    for knob, value in best["knobs"].items():  # the answer's knobs, under vLLM's flag names
        assert body[knob.replace("_", "-")] == value, (knob, body)
    assert "experiment slo-trace" in config.read_text()  # says where it came from
    container = json.loads(args.read_text())
    extra = yaml.safe_load(helm.read_text())["servingEngineSpec"]["modelSpec"][0]
    assert extra["modelURL"] == export.MODEL
    # one knob list: vLLM's reading of the file = the container's = Helm's extraArgs
    flags = _vllm_reads(config)
    assert flags[:2] == ["--model", export.MODEL] == container[:2]
    assert flags[2:] == container[2:] == extra["vllmConfig"]["extraArgs"]
    assert str(tmp_path) not in config.read_text() and "/work/" not in config.read_text()


def test_only_knobs_that_differ_from_vllms_defaults() -> None:
    from tunebook.core import knobs as knob_table

    defaults = knob_table.vllm_defaults()
    a = export.Answer("x", "l", "e1", "qwen3-tiny", {}, {}, {})
    assert "max_num_seqs" not in defaults or defaults["max_num_seqs"] is None
    got = export.knobs_of_argv(["--max-num-seqs", "4", "--no-enable-prefix-caching",
                                "--enforce-eager", "--speculative-config", '{"method": "ngram"}',
                                "--port", "1"])
    assert got == {"max_num_seqs": 4, "enable_prefix_caching": False, "enforce_eager": True,
                   "speculative_config": {"method": "ngram"}}
    assert export.config_yaml(a).rstrip().endswith("model: MODEL")


def test_no_config_to_export_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture
                                               ) -> None:
    assert cli(["deploy", str(tmp_path)]) == 2
    assert "no stored run" in capsys.readouterr().err
    assert cli(["deploy", str(SEARCHED), "--config", "nope"]) == 2
    assert "has no engine config 'nope'; it has:" in capsys.readouterr().err
    pair = REPO / "outputs" / "cpu" / "ch06-disagg"  # a prefill/decode pair: not one engine
    assert cli(["deploy", str(pair), "--config", "e6630fdabed", "--out", str(tmp_path)]) == 2
    assert "served by a prefill/decode pair" in capsys.readouterr().err


def test_booleans_and_mappings_read_back_as_the_same_flags(tmp_path: Path) -> None:
    a = export.Answer("x", "l", "e1", "qwen3-tiny",
                      {"max_num_seqs": 3, "enable_prefix_caching": False, "enforce_eager": True,
                       "speculative_config": {"method": "ngram", "num_speculative_tokens": 2}},
                      {}, {})
    config = export.write(a, tmp_path)[0]
    assert _vllm_reads(config) == export.container_args(a)
    assert "--no-enable-prefix-caching" in export.container_args(a)


@pytest.mark.engine
def test_vllm_started_from_the_exported_answer_runs_with_each_knob(tmp_path: Path) -> None:
    """The committed CPU search's answer, exported and started with vLLM's own config reader."""
    a = export.pick(SEARCHED)
    config = export.write(a, tmp_path)[0]
    checks = export.prove(a, config, resolve_model(a.model), tmp_path / "prove.log", a.env)
    assert set(checks) == set(a.knobs) >= {"max_num_seqs", "max_num_batched_tokens"}
    assert all(c["ok"] for c in checks.values()), checks
    log = (tmp_path / "prove.log").read_text()
    # no knob flag on the command line (ConfigFileEngine passes the file alone): the file
    # carried each knob into vLLM's non-default args
    assert "'max_num_seqs': " + str(a.knobs["max_num_seqs"]) in log
    # a knob the engine did not take is caught: the same log against another answer
    other = export.Answer("x", "l", "e1", "qwen3-tiny", {"max_num_seqs": 5}, {}, {})
    assert not export.in_effect(other, log, "")["max_num_seqs"]["ok"]
