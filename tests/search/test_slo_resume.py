"""`tunebook tune`'s evaluator on the real sweep with a simulated engine (no vLLM): every point
is an ordinary stored run, a config's engine stays up across its load levels, and a search
interrupted mid-way resumes without running a finished point again."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from test_slo import BOUNDS, SPACE, SimEngine

from fake_server import FakeEngine
from tunebook.inputs import params as P
from tunebook.inputs import slo
from tunebook.measure import point as point_mod
from tunebook.measure import supply as S_supply
from tunebook.measure import sweep as S
from tunebook.measure.loads import client as client_kind
from tunebook.measure.supply import FreshSupply
from tunebook.present import workbook
from tunebook.search import adaptive
from tunebook.search import tune as slo_search

LEVELS = [1, 2, 4, 8, 16, 32, 64, 128]


class SimServer(FakeEngine):
    """A FakeEngine that starts and stops, and knows its config's knobs."""

    started = 0

    def __init__(self, tmp: Path, knobs: dict[str, Any]) -> None:
        super().__init__(tmp)
        self.knobs = knobs
        self.up = False
        self.phases = None

    def start(self, on_phase: Any = None) -> None:
        SimServer.started += 1
        self.up = True

    def stop(self) -> None:
        self.up = False

    def alive(self) -> bool:
        return self.up


@pytest.fixture
def sim(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    state: dict[str, Any] = {"engine": None, "benched": [], "interrupt_at": None}
    SimServer.started = 0

    def engine(self: FreshSupply, cfg: Any, model: Any, options: Any) -> SimServer:
        knobs = {k: cfg.knobs[k] for k in SPACE}
        state["engine"] = SimServer(tmp_path, knobs)
        return state["engine"]

    def bench(argv: list[str], api_key: str | None = None, quiet: bool = True,
              timeout_s: float | None = None, cache: Any = None,
              timings: dict | None = None, death: Any = None) -> tuple[dict, str]:
        users = int(argv[argv.index("--max-concurrency") + 1])
        knobs = state["engine"].knobs
        if state["interrupt_at"] is not None and len(state["benched"]) == state["interrupt_at"]:
            raise KeyboardInterrupt
        state["benched"].append((tuple(sorted(knobs.items())), users))
        m = SimEngine.model(knobs, users)
        n = users * 2
        return {"completed": n, "failed": 0, "duration": 1.0,
                "output_throughput": m["output_tok_s"], "p99_tpot_ms": m["p99_tpot_ms"],
                "p99_ttft_ms": m["p99_ttft_ms"], "ttfts": [0.1] * n}, "printed"

    monkeypatch.setattr(FreshSupply, "new", engine)  # the kept supply's too
    monkeypatch.setattr(client_kind, "run_bench", bench)
    monkeypatch.setattr(point_mod, "_scrape", lambda server, errors: None)
    return state


def _params() -> P.SweepParams:
    return P.parse({
        "experiment": "slo-sim", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
        "load": {"users": LEVELS, "reset_prefix_cache": False, "num_warmups": 0},
        "slo": [str(b) for b in BOUNDS],
        "search": {"knobs": SPACE, "users": LEVELS, "sampler": "grid"}})


def _search(params: P.SweepParams, out: Path) -> tuple[adaptive.SearchResult,
slo_search.SweepEvaluator]:
    ev = slo_search.SweepEvaluator(params, out, progress=False)
    try:
        return adaptive.search(ev, slo.parse_search(params.section(slo.SEARCH)), BOUNDS), ev
    finally:
        ev.close()


def test_points_are_stored_runs_and_a_config_starts_once(sim: dict, tmp_path: Path) -> None:
    res, ev = _search(_params(), tmp_path / "out")
    assert res.best is not None
    configs = {c for c, _ in sim["benched"]}
    assert ev.engine_starts == SimServer.started == len(configs)  # one start per config
    runs = list((tmp_path / "out" / "slo-sim" / "runs").glob("*.json"))
    assert len(runs) == len(sim["benched"]) == len(res.points)


def test_one_sweep_serves_the_whole_search(sim: dict, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The search holds one sweep open: its params recorded once, the stored runs read once
    (not once per point: a search of n points read the runs n times), one lock taken."""
    from tunebook.results.store import Store
    reads, locks = [], []
    rows = Store.rows
    monkeypatch.setattr(Store, "rows", lambda self: reads.append(1) or rows(self))
    lock = S.experiment_lock
    monkeypatch.setattr(S, "experiment_lock", lambda root: locks.append(root) or lock(root))
    res, _ = _search(_params(), tmp_path / "out")
    assert len(res.points) > 10
    # read when the sweep opens, and once more for the results table when the search ends
    assert (len(reads), len(locks)) == (2, 1)
    assert len(list((tmp_path / "out" / "slo-sim" / "inputs").glob("params__*.yaml"))) == 1


def test_interrupted_search_resumes_without_rerunning_points(sim: dict,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "out"
    full, _ = _search(_params(), tmp_path / "reference")
    reference = list(sim["benched"])
    sim["benched"].clear()
    sim["interrupt_at"] = 7
    with pytest.raises(KeyboardInterrupt):
        _search(_params(), out)
    first = list(sim["benched"])
    assert len(first) == 7
    sim["interrupt_at"] = None
    sim["benched"].clear()
    again, ev = _search(_params(), out)
    assert not set(first) & set(sim["benched"])  # nothing finished ran again
    assert sorted(first + sim["benched"]) == sorted(reference)  # the same points in all
    assert again.best is not None and full.best is not None
    assert again.best.knobs == full.best.knobs and again.best.score == full.best.score
    assert ev.points_run == len(sim["benched"])
    # engine time comes from the stored rows: the resumed search counts what the points of the
    # first (killed) invocation cost then, each config's start once
    rows = [r for r in ev.store.rows() if r["status"] == "ok"]
    assert ev.engine_s == pytest.approx(
        sum(slo_search.point_cost([r])["seconds"] for r in rows)
        + sum({r["engine_config_id"]: r.get("startup_s") or 0.0 for r in rows}.values()),
        abs=0.05)


def test_a_stored_only_evaluator_never_starts_an_engine(sim: dict, tmp_path: Path) -> None:
    """benchmarks/slo_bench.py --stored-only: a grid measured over several device calls is
    summed up from its stored points; a point never measured is 'missing', not run."""
    p = _params()
    _search(p, tmp_path / "out")
    measured = {(c, u) for c, u in sim["benched"]}
    started = SimServer.started
    ev = slo_search.SweepEvaluator(p, tmp_path / "out", progress=False, stored_only=True)
    grid = adaptive.full_grid(ev, slo.parse_search(p.section(slo.SEARCH)), BOUNDS)
    assert SimServer.started == started  # nothing started
    for pt in grid.points:
        stored = (tuple(sorted(pt.knobs.items())), pt.users) in measured
        assert (pt.row.get("status") == "ok") == stored
        assert stored or pt.row["status"] == slo_search.STATUS_MISSING


def test_repeats_measured_on_a_device_are_read_back_without_an_engine(
        sim: dict, tmp_path: Path) -> None:
    """slo_bench --noise-check N --stored-only: the repeats a device call measured are reported
    here from their stored runs; nothing starts, and a pick never re-measured has no values."""
    p, knobs = _params(), {"max_num_seqs": 8, "max_num_batched_tokens": 2048}
    picks = {"grid's answer": {"knobs": knobs, "users": 4}}
    live = slo_search.remeasure(p, tmp_path / "out", picks, 3, "output_tok_s", BOUNDS,
                                progress=False)
    started = SimServer.started
    picks["other"] = {"knobs": {**knobs, "max_num_seqs": 16}, "users": 4}
    back = slo_search.remeasure(p, tmp_path / "out", picks, 3, "output_tok_s", BOUNDS,
                                progress=False, stored_only=True)
    assert SimServer.started == started  # nothing started
    assert back[0]["values"] == live[0]["values"] and len(back[0]["values"]) == 3
    assert back[0]["meets"] == live[0]["meets"] and back[0]["engine_s"] >= 0
    assert back[1]["values"] == [] and back[1]["mean"] is None


def test_no_engine_starts_that_the_deadline_would_kill(sim: dict, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """TUNEBOOK_DEADLINE (a device call's limit): a search stops before starting an engine
    when its stored runs say a start and a run take longer than what is left; nothing is
    recorded as interrupted, and the same search resumes once time is given."""
    import time

    from tunebook.core import config
    monkeypatch.setenv(config.STATE_DIR_ENV, str(tmp_path / "state"))  # its own record of starts
    p = _params()
    sim["interrupt_at"] = 3  # stored points from a first call: a few, then Ctrl-C
    with pytest.raises(KeyboardInterrupt):
        _search(p, tmp_path / "out")
    sim["interrupt_at"] = None
    store = S.Sweep(p, tmp_path / "out").store
    before = sorted(x.name for x in store.runs_dir.glob("*.json"))
    need = S_supply.time_needed(store.rows(), 1)
    assert need is not None and need >= 1.0  # the sim's start is 1 s
    started = SimServer.started
    monkeypatch.setenv(config.DEADLINE_ENV, str(time.time() + need / 2))
    with pytest.raises(S_supply.DeadlineNear, match="not started"):
        _search(p, tmp_path / "out")
    assert SimServer.started == started  # no start the deadline would have killed
    assert sorted(x.name for x in store.runs_dir.glob("*.json")) == before
    monkeypatch.setenv(config.DEADLINE_ENV, str(time.time() + 3600))
    res, _ = _search(p, tmp_path / "out")
    assert res.best is not None
    # a fresh experiment has no start stored: this machine's slowest start of the model
    assert S_supply.slowest_start("qwen3-tiny") == pytest.approx(1.0)  # the sim's, noted above
    monkeypatch.setenv(config.DEADLINE_ENV, str(time.time() + 0.5))
    started = SimServer.started
    with pytest.raises(S_supply.DeadlineNear):
        _search(p, tmp_path / "fresh")
    assert SimServer.started == started
    monkeypatch.setenv(config.DEADLINE_ENV, "soon")
    with pytest.raises(config.EnvError, match="TUNEBOOK_DEADLINE"):
        S.Sweep(p, tmp_path / "other").run()


def test_time_needed_is_the_slowest_start_and_the_median_run() -> None:
    def row(start: float | None, secs: float, status: str = "ok") -> dict:
        return {"status": status, "startup_s": start, "started_at": "2026-12-04T00:00:00Z",
                "finished_at": f"2026-12-04T00:00:{secs:02.0f}Z"}
    rows = [row(90.0, 10), row(None, 20), row(140.0, 12), row(500.0, 50, "failed")]
    assert S_supply.time_needed(rows, 2) == pytest.approx(140.0 + 2 * 12)
    assert S_supply.time_needed([row(None, 10)], 1) is None and S_supply.time_needed([], 1) is None
    assert S_supply.time_needed([], 3, machine_start_s=120.0) == 120.0


def test_point_cost_reads_a_runs_clock() -> None:
    row = {"started_at": "2026-12-04T04:23:16.615Z", "finished_at": "2026-12-04T04:23:18.294Z",
           "startup_s": 27.5}
    assert slo_search.point_cost([row, row]) == {"seconds": pytest.approx(3.36),
                                                 "start_s": 27.5}
    assert slo_search.point_cost([{"status": "failed"}]) == {"seconds": 0.0, "start_s": 0.0}


def test_tune_stores_its_summary_and_says_found(sim: dict, tmp_path: Path) -> None:
    code, out = slo_search.tune(_params(), tmp_path / "out", progress=False)
    assert code == slo_search.EXIT_FOUND and "best" in out
    assert re.match(r"vllm serve \S+ --max-model-len 1024 --max-num-seqs \d+ "
                    r"--max-num-batched-tokens \d+$", out["best"]["serve"])
    stored = slo_search.stored(tmp_path / "out", "slo-sim")
    assert stored is not None and stored["best"] == out["best"]
    assert "best:" in slo_search.report_text(out)


def test_unmeetable_slo_exits_1_with_the_closest_config(sim: dict, tmp_path: Path) -> None:
    p = P.parse({**_params().to_dict(), "slo": ["p99_tpot_ms <= 1"]})
    code, out = slo_search.tune(p, tmp_path / "out", progress=False)
    assert code == slo_search.EXIT_NONE and "best" not in out
    assert out["closest"]["users"] == 1 and out["closest"]["p99_tpot_ms"] > 1
    assert "no config meets the SLO" in slo_search.report_text(out)


@pytest.mark.replot("cpu-slo")
def test_slo_notebook_on_the_stored_search(replots: dict) -> None:
    """notebooks/20_slo replotted from the committed CPU search (benchmarks/slo_bench.py):
    the points chart with the SLO line and the answer, and the configs table."""
    import json

    rc, out = replots["cpu-slo"].wait()
    assert rc == 0, out
    exp = replots["cpu-slo"].exp
    html = (exp / "report.html").read_text()
    assert "Every evaluated point" in html and "best: {" in html and "vllm serve" in html
    nb = json.loads(sorted((exp / "notebooks").glob("20_slo__*.ipynb"))[-1].read_text())
    chart = next(c for c in nb["cells"] if "slo_points" in "".join(c["source"]))
    spec = chart["outputs"][0]["data"]["application/vnd.vegalite.v5+json"]
    assert spec["title"]["text"] == "SLO search: every evaluated point"
    went = next(c for c in nb["cells"] if "slo_configs" in "".join(c["source"]))
    spec = went["outputs"][0]["data"]["application/vnd.vegalite.v5+json"]
    assert spec["title"]["text"] == "Where the search went"


def test_slo_bench_reuse_copies_an_earlier_grids_runs(sim: dict, tmp_path: Path) -> None:
    """benchmarks/slo_bench.py --reuse: an earlier experiment's stored runs of this space's
    configs are copied into the grid's folder (same ids), never over a file already there;
    the grid then finds them stored and starts nothing for them."""
    import dataclasses
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from slo_bench import reuse_grid

    p = _params()
    _search(p, tmp_path / "earlier")
    earlier = tmp_path / "earlier" / "slo-sim"
    runs = sorted((earlier / "runs").glob("*.json"))
    spec = slo.parse_search(p.section(slo.SEARCH))
    assert reuse_grid(p, spec, tmp_path / "new", [earlier]) == len(runs) > 0
    assert reuse_grid(p, spec, tmp_path / "new", [earlier]) == 0  # never copied over
    started = SimServer.started
    grid = dataclasses.replace(p, experiment="slo-sim-grid")
    ev = slo_search.SweepEvaluator(grid, tmp_path / "new", progress=False, stored_only=True)
    got = [ev(dict(k), u) for k, u in {(c, u) for c, u in sim["benched"]}]
    assert SimServer.started == started and all(r["status"] == "ok" for r in got)


def test_a_replot_says_when_the_params_changed_since_the_search(sim: dict, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture
                                                                ) -> None:
    """The notebook's replot shows the newest stored search; when the params' search section
    has changed since it ran (a new budget), it says what the stored one ran with."""
    import yaml

    p = _params()
    code, _ = slo_search.tune(p, tmp_path / "out", progress=False)
    assert code == slo_search.EXIT_FOUND
    changed = p.to_dict()
    changed["search"] = {**changed["search"], "budget": {"patience": 2, "min_gain": 1.05}}
    f = tmp_path / "slo.yaml"
    f.write_text(yaml.safe_dump(changed))
    capsys.readouterr()
    workbook.search(f, outputs=tmp_path / "out", dry_run=True)
    text = capsys.readouterr().out
    assert "patience 2 (configs in a row that beat no best by 1.05×)" in text
    assert "it ran with {'budget': None}: the params have changed since" in text
    f.write_text(yaml.safe_dump(p.to_dict()))  # as it ran: nothing to say
    workbook.search(f, outputs=tmp_path / "out", dry_run=True)
    assert "have changed since" not in capsys.readouterr().out
