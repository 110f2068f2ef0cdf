"""Chapter 7 (Fig 7.1) without an engine: the troubleshooting table is generated from stored
rows, engine logs and the /metrics columns of every experiment of a machine's outputs root —
the committed CPU and H200 runs — a diagnosis rule registered here adds a row, and each rule is
checked on synthetic rows at its threshold. The committed CPU experiment of chapter 7 (its
induced preemption and hang) is replotted through its notebook, beside the other committed CPU
experiments.

The live check of what chapter 7's params induce runs in the lead's test shared with chapter 8
(one engine): it calls `tunebook.figures.ch07_troubleshooting.assert_induced(exp_dir)`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from conftest import Replot
from tunebook import figures
from tunebook.figures import ch07_troubleshooting as ch07
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.present import claims, report
from tunebook.results import diagnose
from tunebook.results.evidence import DIFFERS, HOLDS, load_evidence
from tunebook.results.store import Store
from tunebook.servers.startup import get_rule as startup_rule

REPO = Path(__file__).resolve().parents[2]
OUTPUTS = REPO / "outputs"
RULE_NAMES = ("start_fails", "out_of_memory", "ttft_grows", "throughput_flat", "preemptions",
              "hung", "slow_start")


# --- the table from committed runs -------------------------------------------------------------
def _check_citations(stored: diagnose.Stored, t: pd.DataFrame) -> None:
    """Every cited run exists in the cited experiment, and a citation quotes something."""
    for r in t[t["seen"] > 0].itertuples():
        ev = stored.get(r.experiment)
        assert r.run_id in set(ev.df["run_id"]), (r.rule, r.experiment, r.run_id)
        assert r.evidence and r.check and r.fix and r.page, r.rule


@pytest.fixture(scope="module")
def cpu_stored() -> tuple[diagnose.Stored, pd.DataFrame]:
    """The committed CPU experiments, loaded once, and their table (~4 s to load, ~7 s for the
    table on 2 cores): the tests that read them share one."""
    stored = diagnose.Stored.load(OUTPUTS / "cpu")
    return stored, diagnose.table(stored)


def test_table_from_committed_cpu_runs(cpu_stored: tuple[diagnose.Stored, pd.DataFrame]) -> None:
    stored, t = cpu_stored
    assert tuple(t["rule"]) == tuple(diagnose.RULES) and set(RULE_NAMES) <= set(t["rule"])
    _check_citations(stored, t)
    by = t.set_index("rule")
    assert (by["seen"] > 0).all(), by[by["seen"] == 0].index.tolist()
    # ch02's real failed starts: a max_model_len too long for its KV memory, and no memory
    # left for the KV cache (gpu_memory_utilization 0.01) — the out-of-memory row
    assert by.loc["start_fails", "experiment"] == "ch02"
    assert by.loc["out_of_memory", "experiment"] == "ch02"
    assert "less than requested memory for kv" in by.loc["out_of_memory", "evidence"]
    # what no earlier chapter showed, chapter 7 induced
    for rule, part in (("preemptions", "induce_preemption"), ("hung", "induce_hang")):
        assert by.loc[rule, "experiment"] == "ch07" and by.loc[rule, "induced"], rule
        assert by.loc[rule, "induce"] == part
    assert "vllm:num_preemptions" in by.loc["preemptions", "evidence"]
    assert "did not finish within" in by.loc["hung", "evidence"]
    assert not by.loc["slow_start", "induced"] and by.loc["slow_start", "score"] >= 1


def test_table_from_committed_h200_runs() -> None:
    """The H200 runs show failed starts, a CUDA OOM, TTFT growth, flat throughput and slow
    starts on their own; preemption and a hang need params/ch07-h200.yaml (until its outputs
    are committed, those rows say which part induces them)."""
    stored = diagnose.Stored.load(OUTPUTS / "h200")
    t = diagnose.table(stored)
    _check_citations(stored, t)
    by = t.set_index("rule")
    for rule in ("start_fails", "out_of_memory", "ttft_grows", "throughput_flat",
                 "slow_start"):
        assert by.loc[rule, "seen"] > 0 and not by.loc[rule, "induced"], rule
    assert "CUDA out of memory" in by.loc["out_of_memory", "evidence"]
    c = figures.verdict(load_evidence(OUTPUTS / "h200" / "ch05"), "7.1")
    if (OUTPUTS / "h200" / "ch07").is_dir():
        assert c.verdict == HOLDS, c
    else:
        assert by.loc["preemptions", "seen"] == 0 and by.loc["hung", "seen"] == 0
        assert c.verdict == DIFFERS and "induce_preemption" in c.why and "induce_hang" in c.why


def test_figure_on_committed_cpu_ch07() -> None:
    ev = load_evidence(OUTPUTS / "cpu" / "ch07")
    c = figures.verdict(ev, "7.1")
    assert c.verdict == HOLDS, c
    assert c.measured_value == 1.0 and "induce_preemption" in c.measured
    figures.chart(ev, "7.1").to_dict()  # a valid Vega-Lite spec
    html = figures.get("7.1").html(ev)
    assert html.count("<tr>") == len(diagnose.RULES) + 1  # header + one row per rule
    assert 'href="../ch02/report.html"' in html and "(induced)" in html
    assert str(REPO) not in html  # links are relative, never a machine's path


def test_assert_induced_on_committed_ch07() -> None:
    got = ch07.assert_induced(OUTPUTS / "cpu" / "ch07")
    assert set(got) == {"preemptions", "hung"}
    assert all(f.induced and f.experiment == "ch07" for fs in got.values() for f in fs)
    with pytest.raises(AssertionError, match="no part that induces"):
        ch07.assert_induced(OUTPUTS / "cpu" / "ch05")


# --- the registry: a new rule is a new row -----------------------------------------------------
def test_a_new_rule_adds_a_row(cpu_stored: tuple[diagnose.Stored, pd.DataFrame]) -> None:
    stored, before = cpu_stored

    @diagnosis_once("test_many_prompts", symptom="a test symptom: many prompts",
                    check="num_prompts (rows)", fix="fewer prompts", setting="load.num_prompts",
                    page="5.1")
    def _many(stored: diagnose.Stored) -> list[diagnose.Finding]:
        """A run of 128 prompts or more."""
        return [diagnose.Finding("", ev.experiment, str(r["run_id"]), f"{r['num_prompts']} "
                                 "prompts", r["num_prompts"] / 128)
                for ev, df in stored.rows() for _, r in df.iterrows()
                if not pd.isna(r["num_prompts"]) and r["num_prompts"] >= 128]

    try:
        after = diagnose.table(stored)
        assert len(after) == len(before) + 1
        row = after.set_index("rule").loc["test_many_prompts"]
        assert row["symptom"] == "a test symptom: many prompts" and row["seen"] > 0
        assert row["threshold"] == "A run of 128 prompts or more."
        # the figure's table and verdict pick it up too
        ev = load_evidence(OUTPUTS / "cpu" / "ch07")
        assert "test_many_prompts" in set(figures.get("7.1").table(ev)["rule"])
    finally:
        diagnose.unregister("test_many_prompts")
    assert len(diagnose.table(stored)) == len(before)


def diagnosis_once(name: str, **kw: Any):  # noqa: ANN201 - the registry's decorator
    assert name not in diagnose.RULES
    return diagnose.diagnosis(name, **kw)


def test_registry_refuses_bad_rules() -> None:
    def fn(stored: diagnose.Stored) -> list[diagnose.Finding]:
        """Never."""
        return []

    kw = dict(symptom="s", check="c", fix="f", setting="x")
    with pytest.raises(ValueError, match="already registered"):
        diagnose.diagnosis("hung", page="1.2", **kw)(fn)
    with pytest.raises(ValueError, match="not in the manual"):
        diagnose.diagnosis("test_bad_page", page="9.9", **kw)(fn)

    def undocumented(stored: diagnose.Stored) -> list[diagnose.Finding]:
        return []

    with pytest.raises(ValueError, match="docstring"):
        diagnose.diagnosis("test_no_doc", page="1.2", **kw)(undocumented)
    assert not {"test_bad_page", "test_no_doc"} & set(diagnose.RULES)


# --- each rule on synthetic rows, at its threshold ----------------------------------------------
def _row(run_id: str, **kw: Any) -> dict[str, Any]:
    base = {"run_id": run_id, "experiment": "x", "status": "ok", "engine_config_id": "e1",
            "engine_label": "default", "repeat": 0,
            "finished_at": f"2026-01-01T00:00:{len(run_id):02d}Z",
            "model": "m", "dataset": "random", "input_len": 100, "output_len": 10,
            "prefix_len": 0, "request_rate": None}
    return {**base, **kw}


def _stored(tmp_path: Path, experiments: dict[str, list[dict[str, Any]]],
            logs: dict[str, str] | None = None, params: dict | None = None) -> diagnose.Stored:
    """Experiments written as the sweep writes them: one run JSON per row, an engine log."""
    for name, rows in experiments.items():
        store = Store(tmp_path / name)
        for row in rows:
            log = (logs or {}).get(row["run_id"])
            rec: dict[str, Any] = {"row": {**row, "experiment": name}}
            if log is not None:
                path = tmp_path / name / "engines" / f"{row['run_id']}.log"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(log)
                rec["engine"] = {"log": f"engines/{path.name}"}
                rec["log_span"] = {"log": [0, len(log.encode())]}
            store.save_run(rec)
        if params:
            (tmp_path / name / "inputs").mkdir(exist_ok=True)
            (tmp_path / name / "inputs" / "params__1.yaml").write_text(json.dumps(params))
    return diagnose.Stored.load(tmp_path)


def _found(stored: diagnose.Stored, rule: str) -> list[diagnose.Finding]:
    return diagnose.get(rule).find(stored)


def _curve(ttft: list[float], out: list[float], users: list[int] = (1, 2, 4, 8),
           **kw: Any) -> list[dict[str, Any]]:
    return [_row(f"u{u}", max_concurrency=u, median_ttft_ms=t, output_tok_s=o, **kw)
            for u, t, o in zip(users, ttft, out, strict=True)]


@pytest.mark.parametrize(("ratio", "seen"), [(diagnose.TTFT_GROWTH, True),
                                             (diagnose.TTFT_GROWTH * 0.97, False)])
def test_ttft_grows_at_its_threshold(tmp_path: Path, ratio: float, seen: bool) -> None:
    s = _stored(tmp_path, {"a": _curve([100, 120, 150, 100 * ratio], [10, 20, 40, 80])})
    f = _found(s, "ttft_grows")
    assert bool(f) == seen
    if seen:
        assert f[0].run_id == "u8" and f[0].score == pytest.approx(1.0)
        assert "at 8 users" in f[0].evidence


def test_ttft_grows_names_the_queue_or_the_cap(tmp_path: Path) -> None:
    rows = _curve([10, 20, 40, 80], [1, 2, 3, 4], max_waiting_requests=5)
    s = _stored(tmp_path, {"a": rows})
    f = _found(s, "ttft_grows")[0]
    assert "5 requests waited" in f.evidence and "queued" in f.hint
    rows = _curve([10, 20, 40, 80], [1, 2, 3, 4], max_num_seqs=2)
    f = _found(_stored(tmp_path / "cap", {"a": rows}), "ttft_grows")[0]
    assert "max_num_seqs=2" in f.hint


@pytest.mark.parametrize(("gain", "seen"), [(0.099, True), (0.10, False)])
def test_throughput_flat_at_its_threshold(tmp_path: Path, gain: float, seen: bool) -> None:
    s = _stored(tmp_path, {"a": _curve([1, 1, 1, 1], [100, 200, 400, 400 * (1 + gain)])})
    f = _found(s, "throughput_flat")
    assert bool(f) == seen
    if seen:
        assert f[0].run_id == "u4" and "at 4 users" in f[0].evidence


def test_throughput_flat_needs_twice_the_users(tmp_path: Path) -> None:
    """Flat from u on counts only when the curve reaches 2u users."""
    s = _stored(tmp_path, {"a": _curve([1, 1, 1], [100, 200, 200], users=[1, 4, 6])})
    assert not _found(s, "throughput_flat")


@pytest.mark.parametrize(("n", "seen"), [(1, True), (0, False)])
def test_preemptions_at_their_threshold(tmp_path: Path, n: int, seen: bool) -> None:
    s = _stored(tmp_path, {"a": [_row("r1", max_concurrency=16, preemptions=n,
                                      max_kv_cache_usage=0.99, kv_pool_tokens=1000,
                                      input_len=400, output_len=100)]})
    f = _found(s, "preemptions")
    assert bool(f) == seen
    if seen:
        assert "1 preemptions (vllm:num_preemptions)" in f[0].evidence
        assert "2.0 requests" in f[0].hint and "max_num_seqs at 2" in f[0].hint


def test_preemptions_from_the_log_when_metrics_are_missing(tmp_path: Path) -> None:
    line = ("INFO Engine 000: Running: 4 reqs, Waiting: 9 reqs, Preemptions: 3, GPU KV cache "
            "usage: 99%")
    s = _stored(tmp_path, {"a": [_row("r1"), _row("r2")]}, logs={"r1": line + "\n", "r2": "x\n"})
    f = _found(s, "preemptions")
    assert [x.run_id for x in f] == ["r1"] and "Preemptions: 3" in f[0].evidence


def test_preemptions_marked_induced_by_their_part(tmp_path: Path) -> None:
    s = _stored(tmp_path, {"a": [_row("r1", preemptions=2, part="induce_preemption"),
                                 _row("r2", preemptions=1, part="other")]})
    f = _found(s, "preemptions")
    assert [(x.run_id, x.induced) for x in f] == [("r2", False), ("r1", True)]  # natural first


def test_hung_runs(tmp_path: Path) -> None:
    rows = [_row("t1", status="failed", part="slow",
                 error="LoadError: the benchmark did not finish within 2 s"),
            _row("t2", status="interrupted", error="engine exited during the run"),
            _row("t3", status="failed", error="3 request(s) failed: 500"),
            _row("t4", status="ok")]
    s = _stored(tmp_path, {"a": rows}, logs={"t1": "step 1\nIteration(7): 1 generation requests\n"},
                params={"run_timeout_s": 300, "parts": [{"name": "slow", "run_timeout_s": 2}]})
    f = {x.run_id: x for x in _found(s, "hung")}
    assert set(f) == {"t1", "t2"}
    assert "Iteration(7)" in f["t1"].evidence and "(2 s)" in f["t1"].hint


@pytest.mark.parametrize(("factor", "seen"), [(diagnose.SLOW_FACTOR, True), (1.49, False)])
def test_slow_start_at_its_threshold(tmp_path: Path, factor: float, seen: bool) -> None:
    log = ("INFO torch.compile took 50.00 s in total\n"
           "INFO Graph capturing finished in 7 secs, took 1.00 GiB\n")
    s = _stored(tmp_path, {"a": [_row("fast", startup_s=100.0)],
                           "b": [_row("slow", engine_config_id="e2", startup_s=100.0 * factor)]},
                logs={"slow": log})
    f = _found(s, "slow_start")
    assert bool(f) == seen
    if seen:
        assert f[0].run_id == "slow" and "torch.compile 50 s" in f[0].evidence
        assert "enforce_eager" in f[0].hint


def test_slow_start_needs_another_start_of_the_model(tmp_path: Path) -> None:
    s = _stored(tmp_path, {"a": [_row("one", startup_s=100.0)],
                           "b": [_row("other", engine_config_id="e2", model="n",
                                      startup_s=900.0)]})
    assert not _found(s, "slow_start")


def test_failed_starts_and_out_of_memory(tmp_path: Path) -> None:
    oom = startup_rule("out_of_memory").symptom
    mml = startup_rule("max_model_len").symptom
    rows = [_row("f1", status="engine_failed", error=oom, error_line="CUDA out of memory",
                 error_hint="quantization: fp8"),
            _row("f1b", engine_config_id="e1", max_concurrency=8, status="engine_failed",
                 error=oom, error_line="CUDA out of memory", error_hint="quantization: fp8"),
            _row("f2", engine_config_id="e2", status="engine_failed", error=mml,
                 error_line="estimated maximum model length is 1920")]
    s = _stored(tmp_path, {"a": rows})
    starts = _found(s, "start_fails")
    assert len(starts) == 2  # one per engine config
    oom_found = _found(s, "out_of_memory")
    assert [f.evidence for f in oom_found] == ["CUDA out of memory"]
    assert oom_found[0].hint == "quantization: fp8"


def test_unseen_rule_says_how_to_induce_it(tmp_path: Path) -> None:
    s = _stored(tmp_path, {"a": [_row("r1", status="ok")]})
    t = diagnose.table(s).set_index("rule")
    assert t.loc["preemptions", "seen"] == 0 and t.loc["preemptions", "run_id"] is None
    assert t.loc["preemptions", "induce"] == "induce_preemption"
    ev = load_evidence(tmp_path / "a")
    c = figures.verdict(ev, "7.1")
    assert c.verdict == DIFFERS and "induce_preemption" in c.why
    assert "not seen yet" in figures.get("7.1").html(ev)


# --- params: chapter 7's engine is chapter 8's; a part's own run timeout --------------------------
def test_ch07_params_share_chapter_8s_engine() -> None:
    ch07_engine = make_plan(P.load(REPO / "params" / "ch07.yaml")).engines
    assert len(ch07_engine) == 1
    ch08 = REPO / "params" / "ch08.yaml"
    if not ch08.exists():
        pytest.skip("params/ch08.yaml is not in this checkout yet")
    assert ch07_engine[0].id == make_plan(P.load(ch08)).engines[0].id


@pytest.mark.parametrize("name", ["ch07.yaml", "ch07-h200.yaml"])
def test_ch07_params_induce_with_a_part_timeout(name: str) -> None:
    p = P.load(REPO / "params" / name)
    assert [x.name for x in p.parts] == ["induce_preemption", "induce_hang"]  # the hang last
    assert p.run_timeout_for("induce_hang") == 2 and p.run_timeout_for("induce_preemption") == 300
    assert P.parse(p.to_dict()).parts[1].run_timeout_s == 2  # round-trips
    assert len(make_plan(p).engines) == 1


def test_part_run_timeout_is_checked() -> None:
    data = {"experiment": "x", "model": "qwen3-tiny",
            "parts": [{"name": "a", "run_timeout_s": 0, "load": {"users": [1]}}]}
    with pytest.raises(P.ParamsError, match=r"parts\[0\]\.run_timeout_s"):
        P.parse(data)


# --- the notebook on the committed CPU experiment, beside the machine's others ------------------
@pytest.mark.replot("cpu-ch07")
def test_ch07_notebook_on_stored_rows(replots: dict[str, Replot]) -> None:
    r = replots["cpu-ch07"]
    rc, out = r.wait()
    assert sorted((r.exp / "engines").iterdir()) == r.engine_logs_before, out  # none started
    assert rc == 1, out  # the induced hang is a run that did not finish
    nb = report.latest_notebook(r.exp)
    assert nb.name.startswith("07_troubleshooting__")
    c = {x["figure"]: x for x in claims.evaluate([r.exp]).to_dict("records")}
    assert c["7.1"]["verdict"] == HOLDS, c["7.1"]
    assert 'href="../ch02/report.html"' in (r.exp / "report.html").read_text()
    assert "Where each symptom occurred" in nb.read_text()  # the chart's Vega-Lite spec
