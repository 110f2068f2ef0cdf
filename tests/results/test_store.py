import json
import os
from pathlib import Path

import pandas as pd
import pytest

from tunebook.core import schema
from tunebook.results.store import Store, write_new


def _row(run_id: str, status: str = "ok", **kw) -> dict:
    return {"row": {"run_id": run_id, "status": status, "engine_config_id": "e1",
                    "engine_label": "default", "max_concurrency": 1, "output_tok_s": 10.0,
                    "finished_at": kw.pop("finished_at", "2026-01-01T00:00:00Z"), **kw}}


def test_write_new_never_overwrites(tmp_path: Path) -> None:
    p = write_new(tmp_path / "a.json", b"one")
    with pytest.raises(FileExistsError):
        write_new(p, b"two")
    assert p.read_bytes() == b"one"
    assert [x.name for x in tmp_path.iterdir()] == ["a.json"]  # no temp file left behind


def test_attempts_are_kept_and_ok_wins(tmp_path: Path) -> None:
    s = Store(tmp_path)
    s.save_run(_row("r1", "ok", finished_at="2026-01-01T00:00:01Z"))
    s.save_run(_row("r1", "failed", finished_at="2026-01-01T00:00:02Z"))
    s.save_run(_row("r2", "interrupted"))
    assert len(list(s.runs_dir.glob("*.json"))) == 3
    assert s.finished_run_ids() == {"r1"}
    df = s.table()
    assert list(df["run_id"]) == ["r1", "r2"]
    assert df.set_index("run_id").loc["r1", "status"] == "ok"
    assert len(s.table(latest_only=False)) == 3


def test_table_has_schema_columns_and_types(tmp_path: Path) -> None:
    s = Store(tmp_path)
    s.save_run(_row("r1", max_num_seqs=4, speculative_config={"method": "ngram"}))
    path = s.rebuild_table()
    df = pd.read_parquet(path)
    assert list(df.columns[: len(schema.COLUMNS)]) == list(schema.COLUMN_NAMES)
    assert df["max_concurrency"].dtype == "Int64"
    assert df.loc[0, "max_num_seqs"] == 4
    assert json.loads(df.loc[0, "speculative_config"]) == {"method": "ngram"}
    assert df.loc[0, "schema_version"] == schema.SCHEMA_VERSION


def test_corrupt_file_is_skipped(tmp_path: Path) -> None:
    s = Store(tmp_path)
    s.save_run(_row("r1"))
    (s.runs_dir / "broken.json").write_text("{not json")
    assert s.finished_run_ids() == {"r1"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_reported(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    with pytest.raises(OSError, match="cannot write results"):
        Store(ro / "exp").check_writable()
