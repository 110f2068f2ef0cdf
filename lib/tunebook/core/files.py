"""Files written safely, and stored files read whatever their compression.

Writing: `write_new` (write once, never over: run records), `replace_atomic` (derived files and
small state files: temp file, fsync, rename over). A crash leaves the old file or the whole new
one, never half of one.

Reading: an experiment's engine logs and block recordings may be stored gzipped
(`x.log.gz`, by `tunebook compact`). Readers name the plain path (`x.log`, as the run records
do) and `open_stored` opens whichever is there, plain first: the byte offsets the records keep
(`log_span`) are offsets into the plain bytes, and a gzipped file is read (and seeked) as its
plain bytes.
"""

from __future__ import annotations

import gzip
import os
import re
import tempfile
from pathlib import Path
from typing import BinaryIO

GZ = ".gz"
# a folder name under outputs/ (an experiment's, a machine's): 1-64 letters, digits, '.', '_'
# or '-', starting with a letter or digit (fullmatch it)
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def shared_mode() -> int:
    """The mode `open()` would give a new file (0o666 less the umask, 0644 usually).

    mkstemp makes its files 0600; renamed into place they would hide reports and results from
    a web server or a colleague. The umask is read from /proc (setting it to read it back
    would race with other threads' files); elsewhere it is set to 022 for an instant."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return 0o666 & ~mask


def _temp_with(path: Path, data: bytes, mode: int | None) -> str:
    """A complete, fsynced temp file beside `path` holding `data`; its name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), shared_mode() if mode is None else mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        Path(tmp).unlink(missing_ok=True)  # a full disk leaves no stray temp file behind
        raise
    return tmp


def write_new(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically; refuse to replace an existing file.

    Written to a temp file in the same folder, fsynced, then hard-linked into place:
    a crash leaves either no file or a complete one, and `link` fails if `path` exists.
    """
    tmp = _temp_with(path, data, None)
    try:
        os.link(tmp, path)
    finally:
        os.unlink(tmp)
    return path


def replace_atomic(path: Path, data: bytes, mode: int | None = None) -> Path:
    """Write `data` to `path`, replacing what is there: a temp file, fsynced, renamed over.
    For derived files (the Parquet table, indexes, reports) and small state files a reader may
    open at any moment (pid files, the launcher's hello). The file gets `mode`, by default the
    one `open()` would give it (see `shared_mode`)."""
    tmp = _temp_with(path, data, mode)
    try:
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


# --- stored files, plain or gzipped -------------------------------------------------------
def gz_path(path: Path | str) -> Path:
    """Where the gzipped form of `path` is stored: `x.log` → `x.log.gz`."""
    path = Path(path)
    return path.with_name(path.name + GZ)


def stored_path(path: Path | str) -> Path | None:
    """The file that holds `path`'s bytes: itself, else its `.gz`; None when neither exists.
    Plain wins: `tunebook compact` removes it only once the .gz is proven to unzip to it."""
    path = Path(path)
    if path.is_file():
        return path
    gz = gz_path(path)
    return gz if gz.is_file() else None


def open_stored(path: Path | str) -> BinaryIO:
    """`path` opened for reading its plain bytes (seek and readline work on either form);
    FileNotFoundError naming the plain path when neither form exists."""
    found = stored_path(path)
    if found is None:
        raise FileNotFoundError(2, "No such file (nor its .gz)", str(path))
    return gzip.open(found, "rb") if found.name.endswith(GZ) else found.open("rb")


def read_stored(path: Path | str, start: int = 0, end: int | None = None) -> bytes:
    """The plain bytes [start, end) of `path` (to its end when `end` is None). A gzipped file
    cut short is an OSError, as an unreadable plain one is."""
    try:
        with open_stored(path) as f:
            if start:
                f.seek(start)
            return f.read() if end is None else f.read(max(0, end - start))
    except EOFError as e:  # gzip's word for a truncated stream
        raise OSError(f"{path}: its .gz is cut short ({e})") from e


def read_stored_text(path: Path | str) -> str:
    """The whole of `path` as text, undecodable bytes replaced (engine logs)."""
    return read_stored(path).decode(errors="replace")
