"""Compact run records (tunebook.results.compact) and gzipped engine logs (tunebook.core.files),
on copies of committed experiments: the same record from either form, the Parquet file written
first and checked by its SHA-256, inline where compact gains nothing, `tunebook compact`
lossless and idempotent, logs read the same gzipped, byte spans included. No engine starts."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import altair as alt
import nbformat
import pandas as pd
import pyarrow.parquet as pq
import pytest

from tunebook.cli import EXIT_LOCKED, EXIT_OK, main
from tunebook.core import files, schema
from tunebook.measure.locks import experiment_lock
from tunebook.present import report
from tunebook.results import compact
from tunebook.results.store import Store

OUTPUTS = Path(__file__).resolve().parents[2] / "outputs"
NOISE = OUTPUTS / "cpu" / "slo-bench" / "slo-noise"  # 10 runs of 32-48 users, two engine logs
CH08 = OUTPUTS / "cpu" / "ch08"  # one run with log and block-recording spans


def _copy(src: Path, tmp_path: Path) -> Path:
    """A copy of a committed experiment as it was written before compact records: each run's
    arrays inline in its JSON with its row at schema 1 (1 -> 2 is the identity), engine logs
    and block recordings plain. The committed ones are compact themselves now."""
    exp = Path(shutil.copytree(src, tmp_path / src.name))
    for path in sorted((exp / "runs").glob("*.json")):
        rec = compact.read_record(path)
        parquet = path.with_name(compact.requests_name(path.name))
        if parquet.is_file():
            parquet.unlink()
            rec["row"]["schema_version"] = 1
            path.write_bytes(compact.record_bytes(rec))
    for gz in sorted((exp / "engines").glob("*.gz")):
        plain = gz.with_suffix("")
        plain.write_bytes(files.read_stored(plain))
        # the copy's time, as copytree keeps it: a log written now counts as an engine start
        # in the suite's summary (conftest)
        os.utime(plain, ns=(gz.stat().st_atime_ns, gz.stat().st_mtime_ns))
        gz.unlink()
    return exp


def _first_record(exp: Path) -> tuple[Path, dict]:
    path = sorted((exp / "runs").glob("*.json"))[0]
    return path, compact.read_record(path)


@pytest.fixture
def noise(tmp_path: Path) -> Path:
    """slo-noise as written inline (10 runs of 32-48 users, two engine logs)."""
    return _copy(NOISE, tmp_path / "inline")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != ".lock"}


def test_a_committed_record_round_trips_compact(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _, before = _first_record(NOISE)
    assert before["row"]["schema_version"] == schema.SCHEMA_VERSION  # stored as 1, migrated
    written: list[str] = []
    real_write_new = files.write_new

    def spy(path: Path, data: bytes) -> Path:
        written.append(path.name)
        return real_write_new(path, data)

    monkeypatch.setattr("tunebook.results.store.write_new", spy)
    store = Store(tmp_path / "exp")
    path = store.save_run(copy.deepcopy(before))
    parquet = path.with_name(compact.requests_name(path.name))
    assert written == [parquet.name, path.name]  # the arrays first: the JSON names them
    stored = json.loads(path.read_bytes())
    assert "requests" not in stored and stored["row"] == before["row"]
    ref = stored["requests_file"]
    assert ref["name"] == parquet.name and ref["requests"] == len(before["requests"]["ttfts"])
    assert parquet.stat().st_size < len(json.dumps(before["requests"]))
    (again,) = store.records()
    assert compact.same(again, before) and again == before
    assert list(again) == list(before)  # the arrays back where they were
    meta = pq.ParquetFile(parquet).metadata.row_group(0)
    cols = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    for name in ("ttfts", "start_times", "itls.list.element"):
        assert "BYTE_STREAM_SPLIT" in cols[name].encodings and cols[name].compression == "ZSTD"
    (light,) = store.records(requests=False)
    assert "requests" not in light and light["requests_file"] == ref
    assert store.rows() == [before["row"]]
    assert store.record_of(before["row"]) == before


@pytest.mark.parametrize("arrays, why", [
    ({"ttfts": [0.1] * 4, "errors": [""] * 4}, "smaller inline"),  # a few requests
    ({"ttfts": [1, 0.5] * 200}, "mixes value types"),  # 1 would read back as 1.0
    ({"ttfts": [0.1] * 300, "errors": [""] * 299}, "different lengths"),
    ({"itls": [[0.1, 1]] * 300}, "mixes value types"),
])
def test_arrays_stay_inline_where_compact_would_lose_or_gain_nothing(
        tmp_path: Path, arrays: dict, why: str) -> None:
    record = {"row": {"run_id": "r1", "status": "ok", "schema_version": schema.SCHEMA_VERSION},
              "requests": arrays}
    assert why in (compact.encode(copy.deepcopy(record), "r1__x.json").inline_why or "")
    store = Store(tmp_path)
    path = store.save_run(copy.deepcopy(record))
    assert list(store.runs_dir.iterdir()) == [path]
    assert json.loads(path.read_bytes())["requests"] == arrays
    (back,) = store.records()
    assert compact.same(back["requests"], arrays)


def test_nulls_empty_gaps_and_texts_round_trip(tmp_path: Path) -> None:
    n = 200
    arrays = {"input_lens": [7] * n, "ttfts": [None if i % 7 == 0 else i / 3 for i in range(n)],
              "itls": [[] if i % 5 == 0 else None if i % 11 == 0 else [0.01, 0.02 * i]
                       for i in range(n)],
              "errors": ["" if i % 9 else "boom" for i in range(n)],
              "generated_texts": [f"def f{i}(): return {i}" for i in range(n)],
              "nothing": [None] * n}
    store = Store(tmp_path)
    path = store.save_run({"row": {"run_id": "r1", "status": "ok"},
                           "requests": copy.deepcopy(arrays)})
    assert "requests_file" in json.loads(path.read_bytes())
    (back,) = store.records()
    assert compact.same(back["requests"], arrays)
    assert not compact.same({"x": [1]}, {"x": [1.0]}) and compact.same([float("nan")],
                                                                        [float("nan")])


def test_a_missing_or_altered_parquet_file_is_reported(tmp_path: Path) -> None:
    _, before = _first_record(NOISE)
    store = Store(tmp_path)
    path = store.save_run(copy.deepcopy(before))
    parquet = path.with_name(compact.requests_name(path.name))
    data = parquet.read_bytes()
    parquet.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    with pytest.warns(RuntimeWarning, match="sha256"):
        (rec,) = store.records()
    assert "requests" not in rec and "altered" in rec["requests_error"]
    parquet.unlink()
    with pytest.warns(RuntimeWarning, match="missing"):
        (rec,) = store.records()
    assert "requests" not in rec and parquet.name in rec["requests_error"]
    assert store.rows() == [before["row"]]  # rows never need the file


def test_a_version_1_record_reads_migrated_and_compact_needs_version_2(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, noise: Path) -> None:
    src, _ = _first_record(noise)
    raw = json.loads(src.read_bytes())
    assert raw["row"]["schema_version"] == 1 and "requests" in raw
    path = Store(tmp_path).runs_dir / src.name
    path.parent.mkdir(parents=True)
    shutil.copy(src, path)
    rec = compact.read_record(path)
    assert rec["row"] == {**raw["row"], "schema_version": 2}  # the identity, version bumped
    assert rec["requests"] == raw["requests"] and path.read_bytes() == src.read_bytes()
    # a version-1 row is never written compact: a schema-1 reader would drop its arrays
    assert compact.encode(raw, src.name).inline_why == "a row of schema 1"
    # and a schema-1 tunebook refuses a compact record instead of reading it without arrays
    Store(tmp_path / "new").save_run(copy.deepcopy(rec))
    monkeypatch.setattr(schema, "SCHEMA_VERSION", 1)
    with pytest.raises(schema.SchemaVersionError, match="result schema 2"):
        Store(tmp_path / "new").rows()


def test_the_compact_command_is_lossless_and_idempotent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    exp = _copy(NOISE, tmp_path / "outputs")
    store = Store(exp)
    before = list(store.records())
    logs = {p.name: p.read_bytes() for p in (exp / "engines").iterdir()}
    table = store.table()
    # a notebook saved with its chart's SVG copy, and a report with CSS it cannot use
    spec = alt.Chart(pd.DataFrame({"x": [1, 2]})).mark_point().encode(x="x").to_dict()
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("c", outputs=[
        nbformat.v4.new_output("display_data", data={report.VEGALITE_MIME: spec,
                                                     "image/svg+xml": report._svg(spec)})])])
    (exp / "notebooks").mkdir()
    (exp / "notebooks" / "nb__1.ipynb").write_text(nbformat.writes(nb))
    page = "<style>.used{color:red} .unused{color:blue}</style><p class='used'>x</p>"
    report.report_path(exp).write_text(page)
    assert main(["compact", str(tmp_path / "outputs")]) == EXIT_OK
    out = capsys.readouterr().out
    assert f"{exp}: records compacted: 10 (" in out and "engine logs gzipped: 2 (" in out
    assert "chart SVG copies dropped from 1 of 1" in out and "report.html: CSS" in out
    saved = nbformat.read(str(exp / "notebooks" / "nb__1.ipynb"), as_version=4)
    assert list(saved.cells[0].outputs[0]["data"]) == [report.VEGALITE_MIME]
    assert ".unused" not in report.report_path(exp).read_text()
    assert len(list(store.runs_dir.glob("*.requests.parquet"))) == 10
    assert compact.same(list(store.records()), before)
    assert sorted(p.name for p in (exp / "engines").iterdir()) == sorted(
        files.gz_path(n).name for n in logs)
    for name, data in logs.items():
        assert files.read_stored(exp / "engines" / name) == data
    assert store.table().equals(table) and (exp / "results.parquet").is_file()
    after = _snapshot(exp)
    assert main(["compact", str(exp)]) == EXIT_OK
    assert "nothing left to convert (records compact: 10, inline: 0; logs gzipped: 2)" in \
        capsys.readouterr().out
    assert _snapshot(exp) == after
    with experiment_lock(exp):  # a sweep holds it: left alone
        assert main(["compact", str(exp)]) == EXIT_LOCKED
    assert "left as it was" in capsys.readouterr().err


def test_gzipped_logs_read_as_plain_ones(tmp_path: Path) -> None:
    """Every reader of engine logs and block recordings: the same text, spans included."""
    from tunebook.figures import ch08_internals as ch08
    from tunebook.results import diagnose
    from tunebook.results.evidence import load_evidence
    from tunebook.servers import start_phases

    exp = _copy(CH08, tmp_path)

    def read() -> tuple:
        ev = load_evidence(exp)
        stored = diagnose.Stored.of([ev])
        row = ev.df.iloc[0]
        steps = [(r.run_id, r.pool, r.steps) for r in ch08.recorded(ev)]
        return (stored.engine_log(ev.experiment, row), stored.run_log(ev.experiment, row),
                stored.run_steps(ev.experiment, row), stored.log_after_run(ev.experiment, row),
                ch08.iterations(ev).to_dict("records"), steps,
                start_phases.phases_frame(ev.records, exp).to_dict("records"))

    plain = read()
    assert plain[1] and plain[2] and plain[4] and plain[5] and plain[6]  # all were read
    done = compact.convert_experiment(exp)
    assert done.logs == 2 and not list((exp / "engines").glob("*.log"))
    assert read() == plain
    log = next(p.name.removesuffix(".gz") for p in sorted((CH08 / "engines").iterdir())
               if p.name.endswith((".log", ".log.gz")))  # committed: gzipped
    stored = exp / "engines" / log
    text = files.read_stored(CH08 / "engines" / log)
    for start, end in ((0, 10), (18689, 83298), (len(text) - 5, None), (len(text), None)):
        assert files.read_stored(stored, start, end) == text[start:end]
    with pytest.raises(FileNotFoundError):
        files.read_stored(exp / "engines" / "nope.log")


def test_the_logs_of_a_running_engine_stay_plain(tmp_path: Path) -> None:
    """An engine kept up after its sweep (the tuning panel's) still appends to its log and its
    block recording: both are left plain, its runs' records converted all the same."""
    exp = _copy(CH08, tmp_path)
    log = next((exp / "engines").glob("*.log"))
    done = compact.convert_experiment(exp, live_logs=[log])
    assert done.records == 1 and done.logs == 0 and len(done.live) == 2
    assert sorted(p.name for p in (exp / "engines").iterdir()) == sorted(
        p.name.removesuffix(".gz") for p in (CH08 / "engines").iterdir())
    assert "logs of running engines left plain: 2" in done.text()
