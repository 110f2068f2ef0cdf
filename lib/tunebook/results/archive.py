"""Experiments that travel: `tunebook pack` writes an experiment folder as one gzipped tar,
`tunebook unpack` checks all of it, then merges it into an outputs folder.

A pack::

    MANIFEST.json   the first member: the experiment's name relative to its outputs root
                    (`h200/ch04`), tunebook's version and commit, the result schema's version,
                    when it was packed, and each file's path (relative to the experiment),
                    size and SHA-256
    runs/…, engines/…, inputs/…, notebooks/…, report.html, plan.json, …   every other file

Left out: results.parquet (derived: unpack rebuilds it from runs/) and dot files (the
experiment lock, atomic writes' temp files, write probes, Jupyter checkpoints), which are
machinery, never results.

Unpack reads and checks the whole archive (into memory, large members into temp files) before
it writes anything: a truncated archive, a file whose bytes differ from its checksum, a file
missing from the archive or absent from the manifest, a path that is absolute, climbs out with
`..` or is not a plain file, a row of a newer schema: each is an ArchiveError (or
SchemaVersionError) naming the file, and nothing is written. Then it merges under the store's
never-overwrite rule: absent files are added, identical ones skipped, and a file that exists
with other bytes keeps the local copy and is reported. Each experiment that gained runs has
its table rebuilt.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import tarfile
import tempfile
import zlib
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import IO, Any

from tunebook.core import config, hardware, schema
from tunebook.results.store import (
    RUNS,
    TABLE,
    Store,
    find_experiments,
    shared_mode,
    stamp,
    utc_now,
    write_new,
)

MANIFEST = "MANIFEST.json"
FORMAT = "tunebook-pack"
FORMAT_VERSION = 1
_CHUNK_BYTES = 1 << 20
_IN_MEMORY_BYTES = 16 << 20  # a member larger than this is spooled to a temp file


def tunebook_version() -> str:
    """The installed package's version (its metadata: the package's top level is above this
    layer)."""
    try:
        return metadata.version("tunebook")
    except metadata.PackageNotFoundError:  # lib/ on the path, not installed
        return "unknown"


class ArchiveError(ValueError):
    """A pack that cannot be unpacked as it is (or a folder that cannot be packed)."""


@dataclass(frozen=True)
class Entry:
    path: str  # relative to the experiment, '/'-separated
    size_bytes: int
    sha256: str


@dataclass
class Manifest:
    experiment: str  # relative to the outputs root, e.g. "h200/ch04"
    files: list[Entry]
    tunebook_version: str = field(default_factory=tunebook_version)
    tunebook_commit: str | None = field(default_factory=hardware.git_commit)
    schema_version: int = schema.SCHEMA_VERSION
    created_utc: str = field(default_factory=utc_now)
    format: str = FORMAT
    format_version: int = FORMAT_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), indent=1).encode()


@dataclass
class Unpacked:
    """What an unpack did, file by file (paths relative to `root`)."""

    root: Path
    added: list[str] = field(default_factory=list)
    identical: list[str] = field(default_factory=list)
    kept_local: list[str] = field(default_factory=list)
    rebuilt: list[Path] = field(default_factory=list)

    def summary(self) -> str:
        lines = [f"unpacked into {self.root}: {len(self.added)} added, {len(self.identical)} "
                 f"identical, {len(self.kept_local)} kept local"]
        lines += [f"  kept local (differs from the pack's): {p}" for p in self.kept_local]
        lines += [f"  table rebuilt: {p}" for p in self.rebuilt]
        return "\n".join(lines)


# --- packing ------------------------------------------------------------------------------------
def carried(exp_dir: Path) -> list[str]:
    """The files of an experiment folder a pack carries, relative and sorted."""
    out = []
    for top, dirs, files in os.walk(exp_dir):  # symlinked folders are not followed
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in files:
            rel = (Path(top) / name).relative_to(exp_dir).as_posix()
            if not name.startswith(".") and name != TABLE and (Path(top) / name).is_file():
                out.append(rel)
    return sorted(out)


def experiment_name(exp_dir: Path, outputs: Path | None = None) -> str:
    """The experiment's name relative to the outputs root (`h200/ch04`); outside it, the
    folder's own name."""
    exp, root = exp_dir.resolve(), (outputs or config.outputs_dir()).resolve()
    if exp != root and exp.is_relative_to(root):
        return exp.relative_to(root).as_posix()
    return exp.name


def _sha256(path: Path) -> tuple[int, str]:
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK_BYTES):
            h.update(chunk)
            size += len(chunk)
    return size, h.hexdigest()


def _member(name: str, size_bytes: int, mtime_s: float) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mtime, info.mode = size_bytes, int(mtime_s), 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""  # no user names of this machine in a shared file
    return info


def pack(exp_dir: Path | str, out: Path | str | None = None,
         outputs: Path | str | None = None) -> Path:
    """Write `exp_dir` as a pack at `out` (default: `<machine>-<experiment>__<utc>.tar.gz` in
    the current folder); returns its path. The pack is written to a temp file and renamed,
    so a half-written pack never has the final name."""
    exp_dir = Path(exp_dir)
    if not exp_dir.is_dir() or not find_experiments(exp_dir):
        raise ArchiveError(f"{exp_dir}: not an experiment folder (no runs/ or "
                           f"inputs/params__*.yaml under it)")
    name = experiment_name(exp_dir, Path(outputs) if outputs else None)
    files = carried(exp_dir)
    entries = [Entry(rel, *_sha256(exp_dir / rel)) for rel in files]
    manifest = Manifest(name, entries)
    out = Path(out) if out else Path(f"{name.replace('/', '-')}__{stamp()}.tar.gz")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, prefix=f".{out.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), shared_mode())
            with gzip.GzipFile(fileobj=f, mode="wb", compresslevel=6, mtime=0) as gz, \
                    tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                data = manifest.to_bytes()
                tar.addfile(_member(MANIFEST, len(data), 0), io.BytesIO(data))
                for e in entries:
                    path = exp_dir / e.path
                    data = path.read_bytes()  # hashed again: a file rewritten meanwhile is said
                    if hashlib.sha256(data).hexdigest() != e.sha256:
                        raise ArchiveError(f"{path}: changed while it was packed (a sweep or "
                                           f"notebook still writing?); pack again")
                    tar.addfile(_member(e.path, len(data), path.stat().st_mtime),
                                io.BytesIO(data))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


# --- reading ------------------------------------------------------------------------------------
def unsafe(path: str) -> str | None:
    """Why a path from a pack may not be written under the experiment folder, or None."""
    if not path:
        return "an empty path"
    if path.startswith("/") or "\\" in path or (len(path) > 1 and path[1] == ":"):
        return "an absolute path"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "a path that leaves the experiment folder ('..', '.' or an empty part)"
    return None


def _manifest(archive: Path, data: bytes) -> Manifest:
    def bad(why: str) -> ArchiveError:
        return ArchiveError(f"{archive}: {MANIFEST}: {why}")

    try:
        raw = json.loads(data)
    except ValueError as e:
        raise bad(f"not JSON ({e})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise bad(f"not a {FORMAT} manifest")
    if raw.get("format_version") != FORMAT_VERSION:
        raise bad(f"format_version {raw.get('format_version')!r}; this tunebook reads "
                  f"{FORMAT_VERSION}: update tunebook")
    name = raw.get("experiment")
    if not isinstance(name, str) or unsafe(name):
        raise bad(f"experiment {name!r}: {unsafe(name) if isinstance(name, str) else 'not a name'}")
    entries = []
    for f in raw.get("files") if isinstance(raw.get("files"), list) else []:
        try:
            entry = Entry(str(f["path"]), int(f["size_bytes"]), str(f["sha256"]))
        except (KeyError, TypeError, ValueError):
            raise bad(f"a file entry without path, size_bytes and sha256: {f!r}") from None
        if why := unsafe(entry.path):
            raise ArchiveError(f"{archive}: {entry.path}: {why}")
        entries.append(entry)
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths):
        raise bad(f"lists {sorted({p for p in paths if paths.count(p) > 1})} more than once")
    dirs = {"/".join(p.split("/")[:i]) for p in paths for i in range(1, p.count("/") + 1)}
    if clash := sorted(dirs & set(paths)):
        raise bad(f"{clash[0]} is both a file and a folder")
    meta = {k: raw[k] for k in ("tunebook_version", "tunebook_commit", "schema_version",
                                "created_utc") if k in raw}
    return Manifest(name, entries, **meta)


@dataclass
class Verified:
    """A pack read and checked in full: its manifest, and each file's bytes (spooled) and
    modification time."""

    archive: Path
    manifest: Manifest
    contents: dict[str, IO[bytes]]
    mtimes: dict[str, float]

    def read(self, path: str) -> bytes:
        f = self.contents[path]
        f.seek(0)
        return f.read()


@contextlib.contextmanager
def verified(archive: Path | str) -> Iterator[Verified]:
    """Read the whole pack and check it against its manifest; raise ArchiveError naming the
    first problem. Temp files are removed on leaving."""
    archive = Path(archive)
    contents: dict[str, IO[bytes]] = {}
    try:
        yield _verify(archive, contents)
    finally:
        for f in contents.values():
            f.close()


def _verify(archive: Path, contents: dict[str, IO[bytes]]) -> Verified:
    manifest: Manifest | None = None
    mtimes: dict[str, float] = {}
    read_to: str | None = None  # the last member read whole: where a truncation is said
    with open(archive, "rb") as raw:
        try:
            # gzip checks its own length and CRC at the end of the stream, and says when the
            # stream stops early; tarfile's own gzip reader would not
            with gzip.GzipFile(fileobj=raw, mode="rb") as gz:
                with tarfile.open(fileobj=gz, mode="r|") as tar:
                    for member in tar:
                        if manifest is None:
                            if member.name != MANIFEST or not member.isreg():
                                raise ArchiveError(f"{archive}: the first member is "
                                                   f"{member.name!r}, not {MANIFEST}: not a "
                                                   f"tunebook pack")
                            manifest = _manifest(archive, tar.extractfile(member).read())
                            wanted = {e.path: e for e in manifest.files}
                            read_to = MANIFEST
                            continue
                        _check_member(archive, member, wanted, contents)
                        contents[member.name] = _read_checked(
                            archive, tar.extractfile(member), wanted[member.name])
                        mtimes[member.name] = float(member.mtime)
                        read_to = member.name
                while gz.read(_CHUNK_BYTES):  # to the end: the gzip trailer is checked
                    pass
        except (EOFError, tarfile.TarError, zlib.error, gzip.BadGzipFile) as e:
            where = f"after {read_to}" if read_to else f"before its {MANIFEST} was read"
            raise ArchiveError(f"{archive}: truncated or damaged: it breaks off {where} ({e}); "
                               f"nothing was written") from None
    if manifest is None:
        raise ArchiveError(f"{archive}: empty: no {MANIFEST}")
    missing = [e.path for e in manifest.files if e.path not in contents]
    if missing:
        raise ArchiveError(f"{archive}: {missing[0]}: listed in {MANIFEST} but missing from the "
                           f"archive" + (f" (and {len(missing) - 1} more)" if len(missing) > 1
                                         else ""))
    return Verified(archive, manifest, contents, mtimes)


def _check_member(archive: Path, member: tarfile.TarInfo, wanted: dict[str, Entry],
                  seen: dict[str, Any]) -> None:
    name = member.name
    if why := unsafe(name):
        raise ArchiveError(f"{archive}: {name}: {why}")
    if not member.isreg():
        kind = "a link" if member.issym() or member.islnk() else "not a plain file"
        raise ArchiveError(f"{archive}: {name}: {kind}; a pack holds plain files only")
    if name not in wanted:
        raise ArchiveError(f"{archive}: {name}: in the archive but not in its {MANIFEST}")
    if name in seen:
        raise ArchiveError(f"{archive}: {name}: in the archive twice")
    if member.size != wanted[name].size_bytes:
        raise ArchiveError(f"{archive}: {name}: {member.size} bytes in the archive, "
                           f"{wanted[name].size_bytes} in its {MANIFEST}")


def _read_checked(archive: Path, src: IO[bytes] | None, entry: Entry) -> IO[bytes]:
    out: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=_IN_MEMORY_BYTES)
    h, size = hashlib.sha256(), 0
    while src is not None and (chunk := src.read(_CHUNK_BYTES)):
        h.update(chunk)
        size += len(chunk)
        out.write(chunk)
    if size != entry.size_bytes or h.hexdigest() != entry.sha256:
        out.close()
        raise ArchiveError(f"{archive}: {entry.path}: its bytes differ from the SHA-256 in "
                           f"{MANIFEST} (damaged or changed after packing); nothing was written")
    return out


def _check_rows(pack: Verified) -> None:
    """A run row of a newer result schema is refused before anything is written (the table
    could not be rebuilt from it); an unreadable file is left to the store, which skips it."""
    for path in pack.contents:
        parts = path.split("/")
        if len(parts) < 2 or parts[-2] != RUNS or not path.endswith(".json"):
            continue
        try:
            record = json.loads(pack.read(path))
        except ValueError:
            continue
        if isinstance(record, dict) and isinstance(record.get("row"), dict):
            schema.upgrade(record["row"], source=f"{pack.archive}: {path}")


# --- merging ------------------------------------------------------------------------------------
def _digest(path: Path) -> str:
    return _sha256(path)[1]


def _plan(pack: Verified, dest: Path) -> tuple[list[str], list[str], list[str]]:
    """(to add, identical, kept local): decided, and every clash found, before any write."""
    add, same, keep = [], [], []
    root = dest.resolve()
    for e in pack.manifest.files:
        target = dest / e.path
        if not target.resolve().is_relative_to(root):  # a local symlink pointing elsewhere
            raise ArchiveError(f"{pack.archive}: {e.path}: {target} leads out of {dest} "
                               f"(a symlink there); nothing was written")
        parent = next((p for p in reversed(target.parents) if p.is_relative_to(dest)
                       and p.exists() and not p.is_dir()), None)
        if parent is not None:
            raise ArchiveError(f"{pack.archive}: {e.path}: {parent} is a file here, not a "
                               f"folder; nothing was written")
        if target.is_dir():
            raise ArchiveError(f"{pack.archive}: {e.path}: a folder here; nothing was written")
        if not target.exists():
            add.append(e.path)
        elif target.stat().st_size == e.size_bytes and _digest(target) == e.sha256:
            same.append(e.path)
        else:
            keep.append(e.path)
    return add, same, keep


def unpack(archive: Path | str, outputs: Path | str | None = None) -> Unpacked:
    """Check the whole pack, then merge it into `<outputs>/<its experiment>`: files absent
    there are added, identical ones skipped, differing ones keep the local copy (reported);
    each experiment that gained runs (or has no table) gets its table rebuilt."""
    outputs = Path(outputs) if outputs else config.outputs_dir()
    with verified(archive) as pack:
        _check_rows(pack)
        dest = outputs / pack.manifest.experiment
        if dest.exists() and not dest.is_dir():
            raise ArchiveError(f"{pack.archive}: {dest} is a file here; nothing was written")
        add, same, keep = _plan(pack, dest)
        done = Unpacked(dest, identical=same, kept_local=keep)
        by_path = {e.path: e for e in pack.manifest.files}
        for path in add:
            target = dest / path
            try:
                write_new(target, pack.read(path))
            except FileExistsError:  # written meanwhile (a sweep here): the local one stays
                (done.identical if _digest(target) == by_path[path].sha256
                 else done.kept_local).append(path)
                continue
            os.utime(target, (pack.mtimes[path], pack.mtimes[path]))
            done.added.append(path)
    for exp in find_experiments(dest) if dest.is_dir() else []:
        gained = any((dest / p).is_relative_to(exp / RUNS) for p in done.added)
        if gained or not (exp / TABLE).exists():  # a figures-only one too: an empty table
            done.rebuilt.append(Store(exp).rebuild_table())
    return done
