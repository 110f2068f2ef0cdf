"""`tunebook pack` / `unpack`: an experiment travels as one checked file, and an unpack adds
what is missing, never replaces a local file, and writes nothing from a bad archive. No engine."""

from __future__ import annotations

import copy
import gzip
import hashlib
import io
import json
import tarfile
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest

from tunebook.cli import EXIT_BAD_PARAMS, EXIT_OK, main
from tunebook.core import schema
from tunebook.present import claims
from tunebook.results import archive
from tunebook.results.store import TABLE, Store

REPO = Path(__file__).resolve().parents[2]
CH04 = REPO / "outputs" / "h200" / "ch04"

Members = list[tuple[tarfile.TarInfo, bytes]]


def _row(run_id: str) -> dict:
    return {"row": {"run_id": run_id, "status": "ok", "engine_config_id": "e1",
                    "engine_label": "default", "max_concurrency": 1, "output_tok_s": 10.0,
                    "finished_at": "2026-01-01T00:00:00Z"}}


@pytest.fixture
def small(tmp_path: Path) -> Path:
    """A small experiment `m/e` (two runs, a compact sibling, a gzipped engine log, a
    notebook, a report, a lock and a derived table) packed: the pack's path."""
    exp = tmp_path / "src" / "m" / "e"
    store = Store(exp)
    first = store.save_run(_row("r1"))
    store.save_run(_row("r2"))
    first.with_name(first.name.replace(".json", ".requests.parquet")).write_bytes(b"PAR1 x")
    (exp / "engines").mkdir()
    (exp / "engines" / "e1__1.log.gz").write_bytes(gzip.compress(b"engine log\n"))
    (exp / "notebooks").mkdir()
    (exp / "notebooks" / "nb__1.ipynb").write_text("{}")
    (exp / "report.html").write_text("<p>report</p>")
    (exp / ".lock").write_text("")
    store.rebuild_table()
    return archive.pack(exp, tmp_path / "e.tar.gz", tmp_path / "src")


def _members(pack: Path) -> Members:
    with tarfile.open(pack, "r:gz") as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar.getmembers()]


def _write(pack: Path, members: Members) -> Path:
    with tarfile.open(pack, "w:gz") as tar:
        for info, data in members:
            info = copy.copy(info)
            info.size = len(data) if info.isreg() else 0
            tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return pack


def _listed(members: Members, *extra: tuple[str, bytes]) -> Members:
    """`members` with files added both to the archive and, correctly, to its manifest."""
    manifest = json.loads(members[0][1])
    for name, data in extra:
        manifest["files"].append({"path": name, "size_bytes": len(data),
                                  "sha256": hashlib.sha256(data).hexdigest()})
    return [(members[0][0], json.dumps(manifest).encode()), *members[1:],
            *[(tarfile.TarInfo(name), data) for name, data in extra]]


def _files(root: Path) -> dict[str, bytes]:
    """Every file a pack carries (dot files, such as the lock a sweep or `tunebook compact`
    leaves beside a committed experiment, stay behind)."""
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.name.startswith(".")}


def test_a_pack_lists_every_file_but_the_table_and_the_lock(small: Path) -> None:
    members = _members(small)
    assert members[0][0].name == archive.MANIFEST
    manifest = json.loads(members[0][1])
    assert manifest["experiment"] == "m/e" and manifest["format"] == archive.FORMAT
    assert {"tunebook_version", "schema_version", "created_utc"} <= set(manifest)
    names = [f["path"] for f in manifest["files"]]
    assert [m.name for m, _ in members[1:]] == names
    assert sorted(n.rsplit("__", 1)[0] if n.startswith("runs/") else n for n in names) == [
        "engines/e1__1.log.gz", "notebooks/nb__1.ipynb", "report.html", "runs/r1", "runs/r1",
        "runs/r2"]  # a run's JSON and its .requests.parquet; no results.parquet, no .lock
    for f, (_, data) in zip(manifest["files"], members[1:], strict=True):
        assert f["size_bytes"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()


# --- the committed H200 chapter 4, there and back ------------------------------------------------
@pytest.fixture(scope="module")
def ch04(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """outputs/h200/ch04 packed and unpacked (by the commands) into an empty outputs folder:
    (the pack, the unpacked experiment)."""
    tmp = tmp_path_factory.mktemp("ch04")
    pack, outputs = tmp / "ch04.tar.gz", tmp / "outputs"
    assert main(["pack", str(CH04), "--out", str(pack), "--outputs",
                 str(REPO / "outputs")]) == EXIT_OK
    assert main(["unpack", str(pack), "--outputs", str(outputs)]) == EXIT_OK
    return pack, outputs / "h200" / "ch04"


def test_unpacked_experiment_has_the_same_records_and_claims(ch04: tuple[Path, Path]) -> None:
    _, dst = ch04
    src_files, dst_files = _files(CH04), _files(dst)
    assert set(dst_files) == set(src_files)
    assert all(dst_files[p] == src_files[p] for p in src_files if p != TABLE)
    assert Store(dst).rows() == Store(CH04).rows()
    assert (dst / TABLE).is_file()  # rebuilt from runs/, as the store does
    pd.testing.assert_frame_equal(Store(dst).table(), Store(CH04).table())
    want, got = claims.evaluate([CH04]), claims.evaluate([dst])
    assert len(want) >= 4
    pd.testing.assert_frame_equal(got, want)


def test_a_second_unpack_rewrites_nothing(ch04: tuple[Path, Path]) -> None:
    pack, dst = ch04
    before = {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in dst.rglob("*")}
    done = archive.unpack(pack, dst.parents[1])
    assert done.added == [] and done.kept_local == [] and done.rebuilt == []
    assert len(done.identical) == len(archive.carried(CH04))
    assert {p: (p.stat().st_mtime_ns, p.stat().st_ino) for p in dst.rglob("*")} == before


# --- merging: local files win ---------------------------------------------------------------------
def test_local_files_that_differ_survive_an_unpack(small: Path, tmp_path: Path) -> None:
    dst = tmp_path / "out" / "m" / "e"
    run = next(n for n in archive.carried(small.parent / "src" / "m" / "e")
               if n.startswith("runs/r1") and n.endswith(".json"))
    (dst / "runs").mkdir(parents=True)
    local = {run: json.dumps(_row("r1") | {"note": "local"}).encode(),
             "runs/r9__20260101T000000000000Z.json": json.dumps(_row("r9")).encode(),
             "report.html": b"<p>my report</p>"}
    for name, data in local.items():
        (dst / name).write_bytes(data)
    done = archive.unpack(small, tmp_path / "out")
    assert sorted(done.kept_local) == sorted([run, "report.html"])
    assert {n: (dst / n).read_bytes() for n in local} == local
    assert "kept local (differs from the pack's): report.html" in done.summary()
    assert done.rebuilt == [dst / TABLE]
    assert sorted(pd.read_parquet(dst / TABLE)["run_id"]) == ["r1", "r2", "r9"]


# --- refusals: nothing is written -----------------------------------------------------------------
def _truncated(pack: Path, cut: Callable[[bytes], bytes]) -> Path:
    pack.write_bytes(cut(pack.read_bytes()))
    return pack


def _tampered(pack: Path) -> Path:
    members = _members(pack)
    i = next(i for i, (m, _) in enumerate(members) if m.name == "report.html")
    info, data = members[i]
    members[i] = (info, data.replace(b"report", b"Report"))  # same size, other bytes
    return _write(pack, members)


def _link(pack: Path) -> Path:
    link = tarfile.TarInfo("runs/link.json")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    return _write(pack, [*_members(pack), (link, b"")])


REFUSED: dict[str, tuple[Callable[[Path], Path], str]] = {
    "truncated in a member": (lambda p: _truncated(p, lambda b: b[:len(b) // 2]),
                              "truncated or damaged"),
    "truncated trailer": (lambda p: _truncated(p, lambda b: b[:-3]), "truncated or damaged"),
    "tampered file": (_tampered, "report.html: its bytes differ from the SHA-256"),
    "climbs out": (lambda p: _write(p, _listed(_members(p), ("../escape.json", b"{}"))),
                   r"\.\./escape\.json: a path that leaves the experiment"),
    "absolute path": (lambda p: _write(p, _listed(_members(p), ("/tmp/abs.json", b"{}"))),
                      "/tmp/abs.json: an absolute path"),
    "not in the manifest": (
        lambda p: _write(p, [*_members(p), (tarfile.TarInfo("runs/extra.json"), b"{}")]),
        "runs/extra.json: in the archive but not in its MANIFEST.json"),
    "missing from the archive": (
        lambda p: _write(p, [m for m in _members(p) if m[0].name != "report.html"]),
        "report.html: listed in MANIFEST.json but missing from the archive"),
    "a link": (_link, "runs/link.json: a link"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_bad_archive_is_refused_and_nothing_written(small: Path, tmp_path: Path,
                                                      case: str) -> None:
    spoil, said = REFUSED[case]
    bad = spoil(small)
    out = tmp_path / "out"
    with pytest.raises(archive.ArchiveError, match=said):
        archive.unpack(bad, out)
    assert not out.exists()


def test_a_row_of_a_newer_schema_is_refused_before_anything_is_written(small: Path,
                                                                      tmp_path: Path) -> None:
    """Its table could not be rebuilt here: refused whole, as the store refuses such a row."""
    members = _members(small)
    manifest = json.loads(members[0][1])
    i = next(i for i, (m, _) in enumerate(members) if m.name.startswith("runs/r2"))
    record = json.loads(members[i][1])
    record["row"]["schema_version"] = schema.SCHEMA_VERSION + 1
    data = json.dumps(record).encode()
    members[i] = (members[i][0], data)
    entry = next(f for f in manifest["files"] if f["path"] == members[i][0].name)
    entry.update(size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    members[0] = (members[0][0], json.dumps(manifest).encode())
    out = tmp_path / "out"
    with pytest.raises(schema.SchemaVersionError, match=members[i][0].name):
        archive.unpack(_write(small, members), out)
    assert not out.exists()


def test_unpack_command_exits_2_naming_the_file(small: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["unpack", str(_tampered(small)), "--outputs", str(out)]) == EXIT_BAD_PARAMS
    err = capsys.readouterr().err
    assert f"tunebook: {small}: report.html: its bytes differ" in err
    assert not out.exists()


def test_a_folder_without_an_experiment_is_not_packed(tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pack", str(tmp_path), "--out", str(tmp_path / "x.tar.gz")]) == EXIT_BAD_PARAMS
    assert "not an experiment folder" in capsys.readouterr().err
    assert not (tmp_path / "x.tar.gz").exists()
