"""The one knob table (tunebook.core.knobs) against vLLM and against params.

vLLM's own argument parser takes ~15 s to import, so its flags and value choices are
recorded in tests/data/vllm-0.32-serve-args.json. Re-record after a vLLM upgrade with:

    PYTHONPATH=lib .venv/bin/python tests/core/test_knobs.py --record
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from tunebook.core import knobs
from tunebook.inputs import params as P
from tunebook.present import panel
from tunebook.servers import vllm as engine

RECORD = Path(__file__).resolve().parents[1] / "data" / "vllm-0.32-serve-args.json"
VLLM = json.loads(RECORD.read_text())
FLAGS = set(VLLM["flags"])
FLAG_KNOBS = [k for k in knobs.KNOBS.values() if k.flag]


def _params(**engine_knobs: Any) -> dict[str, Any]:
    return {"experiment": "knobs", "model": "qwen3-tiny", "engine": engine_knobs,
            "load": {"users": [1]}}


def test_the_record_is_vllm_0_32() -> None:
    assert VLLM["vllm"].startswith("0.32.") and len(FLAGS) > 300


@pytest.mark.parametrize("knob", FLAG_KNOBS, ids=lambda k: k.name)
def test_every_knob_renders_a_flag_vllm_knows(knob: knobs.Knob) -> None:
    values = [True, False] if knob.types is bool else [knob.example]
    for value in values:
        argv = knobs.argv({knob.name: value})
        assert argv and argv[0] in FLAGS, (knob.name, argv)
        assert all(not a.startswith("--") or a in FLAGS for a in argv), argv


@pytest.mark.parametrize("knob", list(knobs.KNOBS.values()), ids=lambda k: k.name)
def test_every_example_passes_params(knob: knobs.Knob) -> None:
    assert knob.accepts(knob.example)
    if knob.flag:
        P.parse(_params(**{knob.name: knob.example}))


def test_closed_choices_are_values_vllm_accepts() -> None:
    for name, recorded in VLLM["choices"].items():
        ours = set(knobs.KNOBS[name].choices)
        assert ours and ours <= set(recorded), (name, sorted(ours - set(recorded)))
    assert set(knobs.SPEC_METHODS) <= set(VLLM["speculative_methods"])


def test_the_panel_offers_only_values_params_accepts() -> None:
    assert knobs.PANEL_KNOBS, "the panel offers no engine knob"
    for knob in knobs.PANEL_KNOBS:
        assert knob.panel in ("int", "float", "choice")
        offered = knob.panel_choices if knob.panel == "choice" else (knob.example,)
        assert offered, knob.name
        for value in offered:
            P.parse(_params(**{knob.name: value}))  # raises ParamsError if params refuses it
    for method in knobs.PANEL_SPEC_METHODS:
        P.parse(_params(speculative_config={"method": method, "num_speculative_tokens": 3}))


def test_the_panel_builds_its_widgets_from_the_table() -> None:
    """No list of knobs or methods of its own: it reads tunebook.core.knobs."""
    assert not hasattr(panel, "SPEC_METHODS") and not hasattr(panel, "CHOICE_KNOBS")
    assert panel.PANEL_KNOBS is knobs.PANEL_KNOBS
    assert panel.PANEL_SPEC_METHODS is knobs.PANEL_SPEC_METHODS


def test_a_draft_model_method_needs_its_model() -> None:
    needs = [m.name for m in knobs.SPEC_METHODS.values() if m.needs_draft_model]
    assert needs and not set(needs) & set(knobs.PANEL_SPEC_METHODS)
    for method in needs:
        with pytest.raises(P.ParamsError, match="speculative_config.model"):
            P.parse(_params(speculative_config={"method": method, "num_speculative_tokens": 3}))


def test_rendering() -> None:
    flags = engine.knob_flags({"max_num_seqs": 4, "enforce_eager": False, "seed": None,
                               "speculative_config": {"num_speculative_tokens": 3,
                                                      "method": "ngram"}})
    assert flags == ["--max-num-seqs", "4", "--no-enforce-eager", "--speculative-config",
                     '{"method": "ngram", "num_speculative_tokens": 3}']
    assert knobs.argv({"model": "qwen3-8b"}) == []  # an engine_grid model swap is no flag
    with pytest.raises(ValueError, match="unknown engine knob"):
        knobs.argv({"max_num_seq": 4})


def test_the_defaults_read_are_vllms_own() -> None:
    """vllm_defaults (what the tuning panel shows beside a field left at default) against the
    installed vLLM's server parser, asked directly: what `vllm serve` runs without the flag.
    Imports vLLM (~6 s; the bench client imports it in-process anyway)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    read = knobs.vllm_defaults()
    assert set(read) == {k.name for k in FLAG_KNOBS} - {"compilation_config"}  # a factory's
    assert read == {name: getattr(parsed, name) for name in read}
    assert knobs.vllm_defaults() is read  # cached
    assert knobs.default_text("gpu_memory_utilization") == \
        f"vLLM default: {parsed.gpu_memory_utilization}"
    assert knobs.default_text("max_num_seqs") == "vLLM default: None (set at start-up)"


def test_every_knob_is_listed_once() -> None:
    with pytest.raises(ValueError, match="listed twice"):
        knobs._registry((knobs.KNOBS["seed"], knobs.KNOBS["seed"]), "knob")


def record() -> None:
    """Write RECORD from the installed vLLM (slow: imports vLLM)."""
    import typing

    import vllm
    from vllm.config.speculative import SpeculativeConfig
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    flags = sorted({s for a in parser._actions for s in a.option_strings if s.startswith("--")})
    by_flag = {s: a for a in parser._actions for s in a.option_strings}
    method = typing.get_type_hints(SpeculativeConfig)["method"]
    literal = next(a for a in typing.get_args(method) if typing.get_args(a))
    data = {
        "vllm": vllm.__version__,
        "how": "tests/core/test_knobs.py --record: the flags of vLLM's OpenAI server parser, and "
               "the values vLLM accepts for tunebook's closed-choice knobs",
        "flags": flags,
        "choices": {
            "dtype": sorted(map(str, by_flag["--dtype"].choices)),
            "kv_cache_dtype": sorted(map(str, by_flag["--kv-cache-dtype"].choices)),
            "quantization": sorted(QUANTIZATION_METHODS),
        },
        "speculative_methods": sorted(typing.get_args(literal)),
    }
    RECORD.write_text(json.dumps(data, indent=1) + "\n")
    print(f"wrote {RECORD}: {len(flags)} flags, vLLM {vllm.__version__}")


if __name__ == "__main__" and "--record" in sys.argv:
    record()
