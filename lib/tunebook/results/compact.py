"""Compact run records: a run's per-request arrays in a Parquet file beside its JSON.

vLLM's per-request arrays (tunebook.measure.client.REQUEST_ARRAYS: input_lens, output_lens,
ttfts, itls, latencies, start_times, errors; generated_texts with real prompts) are most of a
run's JSON: ~1.7 MB at 256 users, as text. Stored compact, they go to
``runs/<run_id>__<utc>.requests.parquet`` (one row per request: float64 columns with
byte-stream-split and zstd, itls a list<double> column, strings as strings) and the JSON,
still the human-readable row and record, names the file and its SHA-256 where the arrays were::

    "requests_file": {"name": "<run_id>__<utc>.requests.parquet", "sha256": "…", "requests": N}

Rules (they keep a record lossless, whichever form it has):

- compact only where the Parquet file reads back equal to what the inline JSON would, value by
  value and type by type (an int stays an int, None stays None, each itls list its own), and
  where it takes fewer bytes than the arrays as JSON text; otherwise the arrays stay inline (a
  few requests; a column of mixed types; arrays of different lengths);
- the Parquet file is written first, once (``write_new``), then the JSON that names it: a reader
  never finds a JSON whose file is still to come;
- a reader (`read_record`, what tunebook.results.store.Store reads with) gets the same record
  dict from either form; a file that is missing or whose SHA-256 differs is reported in the
  record (``requests_error``) and as a warning, never read as empty arrays;
- the row of a compact record has schema 2 or later (tunebook.core.schema), so a tunebook that
  knows only schema 1, and would read it without its arrays, refuses it.

`convert_experiment` (``tunebook compact``) converts an experiment written inline, in place:
each record is converted, read back and proven equal to the original before its JSON is
replaced; each engine log and block recording is gzipped and proven to unzip to the same bytes
before the plain file is removed (tunebook.core.files reads either form).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import warnings
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tunebook.core import schema
from tunebook.core.files import GZ, gz_path, replace_atomic, write_new

REQUESTS = "requests"  # the record's key of the arrays, inline
REQUESTS_FILE = "requests_file"  # … of the Parquet file that holds them, compact
REQUESTS_ERROR = "requests_error"  # … of why a compact record's arrays could not be read
REQUESTS_SUFFIX = ".requests.parquet"


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and (math.isnan(x) or math.isinf(x)):
        return None
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    if isinstance(x, Path):
        return str(x)
    raise TypeError(f"not JSON serialisable: {type(x).__name__}")


def record_bytes(record: Any) -> bytes:
    """A run record as its JSON file holds it."""
    return json.dumps(record, default=_json_default, allow_nan=False, indent=1).encode()


def requests_name(json_name: str) -> str:
    """The Parquet file of a run file's arrays: `<run>.json` → `<run>.requests.parquet`."""
    return json_name.removesuffix(".json") + REQUESTS_SUFFIX


def same(a: Any, b: Any) -> bool:
    """Two JSON values (what json.loads gives) equal value by value and type by type, through
    dicts and lists: 1 is not 1.0, None is not NaN, NaN is NaN, each itls list its own. What
    "lossless" means here: the JSON written from either is the same, so they are compared as
    that JSON (canonical: keys sorted), by the C encoder (~10^5 floats a big run)."""
    try:
        return _canonical(a) == _canonical(b)
    except (TypeError, ValueError):  # not JSON values: not what a record holds
        return False


_TIGHT = (",", ":")


def _canonical(x: Any) -> str:
    return json.dumps(x, sort_keys=True, allow_nan=True, separators=_TIGHT)


# --- the Parquet file -----------------------------------------------------------------------
_SCALARS = {int: pa.int64(), float: pa.float64(), str: pa.string(), bool: pa.bool_()}


def _arrow_type(values: list[Any]) -> pa.DataType | None:
    """The one Arrow type that holds every value of an array (None: null), or None when its
    values mix types (they would not read back as they were)."""
    kinds = {type(v) for v in values if v is not None}
    if not kinds:
        return pa.null()
    if len(kinds) > 1:
        return None
    (kind,) = kinds
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind is list:  # itls: each request's gaps, seconds
        inner = {type(x) for v in values if v is not None for x in v if x is not None}
        return pa.list_(pa.float64()) if inner <= {float} else None
    return None


def to_parquet(arrays: dict[str, Any]) -> bytes | str:
    """The arrays as a Parquet file, one row per request; or why they cannot be one."""
    lengths = {len(v) for v in arrays.values() if isinstance(v, list)}
    if len(lengths) != 1 or not all(isinstance(v, list) for v in arrays.values()):
        return "arrays of different lengths, or not arrays"
    columns: dict[str, pa.Array] = {}
    floats: list[str] = []
    for name, values in arrays.items():
        typ = _arrow_type(values)
        if typ is None:
            return f"{name!r} mixes value types"
        try:
            columns[name] = pa.array(values, type=typ)
        except (pa.ArrowException, OverflowError, TypeError) as e:
            return f"{name!r}: {e}"
        if typ == pa.float64():
            floats.append(name)
        elif pa.types.is_list(typ):
            floats.append(f"{name}.list.element")
    sink = pa.BufferOutputStream()
    # byte-stream-split only where it helps (floats); dictionaries for the rest (lengths and
    # errors repeat); no statistics or Arrow schema: what a file this small carries for nothing
    dictionary = [n for n, c in columns.items() if c.type != pa.float64()
                  and not pa.types.is_list(c.type)]
    pq.write_table(pa.table(columns), sink, compression="zstd", use_dictionary=dictionary,
                   use_byte_stream_split=floats, write_statistics=False, store_schema=False)
    return sink.getvalue().to_pybytes()


def from_parquet(data: bytes) -> dict[str, list[Any]]:
    """The arrays a Parquet file of `to_parquet` holds, as Python lists."""
    table = pq.read_table(pa.BufferReader(data))
    return {name: table.column(name).to_pylist() for name in table.column_names}


# --- a record, either form --------------------------------------------------------------------
@dataclass(frozen=True)
class Encoded:
    """How a run record is written: its JSON, and its Parquet file when compact."""

    text: bytes  # the JSON file
    requests: bytes | None = None  # the Parquet file (written first); None: arrays inline
    requests_name: str | None = None
    inline_why: str | None = None  # why the arrays stayed inline


def encode(record: dict[str, Any], json_name: str) -> Encoded:
    """The record as written to `json_name`: compact where that is lossless and smaller."""
    arrays = record.get(REQUESTS)
    if not isinstance(arrays, dict) or not arrays:
        return _inline(record, "no per-request arrays")
    version = (record.get("row") or {}).get("schema_version")
    if not isinstance(version, int) or version < schema.COMPACT_SINCE:
        # a tunebook that reads this row's schema would read the record without its arrays
        return _inline(record, f"a row of schema {version}")
    # the arrays as the inline JSON spells them (it indents them, so it is longer still) and
    # reads them back; a NaN raises here as it would there
    arrays_text = json.dumps(arrays, default=_json_default, allow_nan=False, separators=_TIGHT)
    as_read = json.loads(arrays_text)
    data = to_parquet(as_read)
    if isinstance(data, str):
        return _inline(record, data)
    if json.dumps(from_parquet(data), separators=_TIGHT) != arrays_text:  # `same`, in order
        return _inline(record, "the Parquet file does not read back equal")
    name = requests_name(json_name)
    ref = {"name": name, "sha256": hashlib.sha256(data).hexdigest(),
           "requests": len(next(iter(as_read.values())))}
    if len(data) + len(json.dumps(ref)) >= len(arrays_text):
        return _inline(record, f"smaller inline ({len(arrays_text):,} bytes of arrays, "
                               f"{len(data):,} as Parquet)")
    text = record_bytes({(REQUESTS_FILE if k == REQUESTS else k): (ref if k == REQUESTS else v)
                         for k, v in record.items()})
    return Encoded(text, data, name)


def _inline(record: dict[str, Any], why: str) -> Encoded:
    return Encoded(record_bytes(record), inline_why=why)


def _requests_problem(ref: Any, runs_dir: Path) -> tuple[dict[str, list[Any]] | None, str]:
    """(the arrays, "") of a record's requests_file, or (None, why they cannot be read)."""
    if not isinstance(ref, dict) or not isinstance(ref.get("name"), str) \
            or Path(ref["name"]).name != ref["name"]:
        return None, f"{REQUESTS_FILE} {ref!r} names no file beside the record"
    path = runs_dir / ref["name"]
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, (f"{path}: missing; the record's per-request arrays are stored there "
                      f"(sha256 {ref.get('sha256')}), so it is read without them")
    except OSError as e:
        return None, f"{path}: cannot be read ({e.strerror or e}); read without its arrays"
    sha = hashlib.sha256(data).hexdigest()
    if sha != ref.get("sha256"):
        return None, (f"{path}: sha256 {sha} is not the record's {ref.get('sha256')}: the "
                      "file was altered or replaced, so its arrays are not read")
    try:
        return from_parquet(data), ""
    except (pa.ArrowException, OSError, ValueError) as e:
        return None, f"{path}: not a readable Parquet file ({e}); read without its arrays"


def join(record: dict[str, Any], runs_dir: Path) -> dict[str, Any]:
    """The record as its inline form reads: a compact record's `requests_file` replaced by its
    arrays (in its place), or, when they cannot be read, kept with `requests_error` beside it
    (and a warning: a figure must not take a missing file for runs without requests)."""
    if REQUESTS_FILE not in record:
        return record
    arrays, why = _requests_problem(record[REQUESTS_FILE], runs_dir)
    if arrays is None:
        warnings.warn(why, RuntimeWarning, stacklevel=2)
        return {**record, REQUESTS_ERROR: why}
    return {(REQUESTS if k == REQUESTS_FILE else k): (arrays if k == REQUESTS_FILE else v)
            for k, v in record.items()}


def parse_record(text: bytes, path: Path, requests: bool = True) -> Any:
    """A run file's bytes as tunebook.results.store.Store reads them: the row as this code's
    schema (older rows migrated in memory; a newer one raises schema.SchemaVersionError),
    the per-request arrays under "requests" whichever form holds them; with `requests=False`
    without them (no "requests"; a compact record keeps its "requests_file"), the Parquet file
    not read. ValueError when the bytes are not JSON."""
    return finish(json.loads(text), path, requests)


def finish(record: Any, path: Path, requests: bool = True) -> Any:
    """`parse_record` of a run file's parsed JSON (`path` names the file)."""
    if isinstance(record, dict) and isinstance(record.get("row"), dict):
        record["row"] = schema.upgrade(record["row"], source=str(path))
        if requests:
            record = join(record, path.parent)
        else:
            record.pop(REQUESTS, None)
    return record


def read_record(path: Path, requests: bool = True) -> Any:
    """`parse_record` of a run file; None when it cannot be read (a half-written file can
    only be a temp file; those are .tmp)."""
    try:
        return parse_record(path.read_bytes(), path, requests)
    except (OSError, ValueError) as e:
        if isinstance(e, schema.SchemaVersionError):
            raise
        return None


# --- converting an experiment written inline --------------------------------------------------
@dataclass
class Converted:
    """What `convert_experiment` did to one experiment, for its summary line."""

    root: Path
    records: int = 0  # converted now
    records_before_bytes: int = 0
    records_after_bytes: int = 0  # JSON + Parquet
    compact_already: int = 0
    inline: int = 0  # records whose arrays stay inline (none, or nothing to gain)
    logs: int = 0  # gzipped now
    logs_before_bytes: int = 0
    logs_after_bytes: int = 0
    gzipped_already: int = 0
    live: list[str] = field(default_factory=list)  # logs of engines still running: left
    problems: list[str] = field(default_factory=list)  # files left as they were, and why

    @property
    def changed(self) -> bool:
        return bool(self.records or self.logs)

    def text(self) -> str:
        live = f"; logs of running engines left plain: {len(self.live)}" if self.live else ""
        if not self.changed and not self.problems:
            return (f"{self.root}: nothing left to convert (records compact: "
                    f"{self.compact_already}, inline: {self.inline}; logs gzipped: "
                    f"{self.gzipped_already}{live})")
        parts = [f"records compacted: {self.records} ({_mb(self.records_before_bytes)} → "
                 f"{_mb(self.records_after_bytes)}, JSON + Parquet)",
                 f"kept inline: {self.inline}", f"compact already: {self.compact_already}",
                 f"engine logs gzipped: {self.logs} ({_mb(self.logs_before_bytes)} → "
                 f"{_mb(self.logs_after_bytes)})"]
        lines = [f"{self.root}: " + "; ".join(parts) + live]
        lines += [f"  left as it was: {p}" for p in self.problems]
        return "\n".join(lines)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def convert_record(path: Path, done: Converted) -> None:
    """Make one inline run file compact, in place, when `encode` would write it compact: the
    Parquet file first, the record read back through it and proven equal to the original
    (every key, every per-request value), then the JSON replaced (and read back: the original
    bytes are put back if the file does not hold what was proven)."""
    try:
        raw = path.read_bytes()
        record = json.loads(raw)
    except (OSError, ValueError) as e:
        done.problems.append(f"{path.name}: not a readable run record ({e})")
        return
    if not (isinstance(record, dict) and isinstance(record.get("row"), dict)):
        done.problems.append(f"{path.name}: not a run record")
        return
    if REQUESTS_FILE in record:
        done.compact_already += 1
        return
    before = parse_record(raw, path)  # as every reader sees it now (row migrated)
    enc = encode(before, path.name)
    if enc.requests is None or enc.requests_name is None:
        done.inline += 1
        return
    parquet = path.parent / enc.requests_name
    if parquet.exists():  # left by a conversion cut short: the same bytes, or not ours
        if parquet.read_bytes() != enc.requests:
            done.problems.append(f"{path.name}: {parquet.name} exists and holds other bytes")
            return
        ours = False
    else:
        write_new(parquet, enc.requests)
        ours = True
    if not same(parse_record(enc.text, path), before):  # through the file on disk
        if ours:
            parquet.unlink()
        done.problems.append(f"{path.name}: the compact record does not read back equal")
        return
    mode = path.stat().st_mode & 0o777
    replace_atomic(path, enc.text, mode=mode)
    if path.read_bytes() != enc.text:  # what was proven is what is there
        replace_atomic(path, raw, mode=mode)
        done.problems.append(f"{path.name}: read back other bytes once replaced; the original "
                             "was put back")
        return
    done.records += 1
    done.records_before_bytes += len(raw)
    done.records_after_bytes += len(enc.text) + len(enc.requests)


def gzip_file(path: Path, done: Converted) -> None:
    """Gzip one engine log or block recording: `x.log.gz` written once, read back from disk
    and proven to unzip to the same bytes, then `x.log` removed."""
    data = path.read_bytes()
    gz = gz_path(path)
    if gz.exists():  # left by a run cut short before the plain file went
        ours = False
    else:
        write_new(gz, gzip.compress(data, compresslevel=9, mtime=0))
        ours = True
    try:
        equal = gzip.decompress(gz.read_bytes()) == data
    except (OSError, EOFError):
        equal = False
    if not equal:
        if ours:
            gz.unlink()
        done.problems.append(f"{path.name}: {gz.name} does not unzip to the same bytes")
        return
    os.utime(gz, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))  # when it was written
    path.unlink()
    done.logs += 1
    done.logs_before_bytes += len(data)
    done.logs_after_bytes += gz.stat().st_size


def convert_experiment(root: Path, live_logs: Iterable[Path] = ()) -> Converted:
    """Convert one experiment folder in place (the caller holds its experiment lock): every
    run record that `encode` would write compact, every engine log and block recording
    gzipped, except the files of engines still running (`live_logs`: their log paths; the
    block recording and a pair's other logs share the log's name up to its first dot)."""
    done = Converted(root)
    runs = root / "runs"
    for path in sorted(runs.glob("*.json")) if runs.is_dir() else []:
        convert_record(path, done)
    engines = root / "engines"
    live = _stems(live_logs)
    for path in sorted(engines.iterdir()) if engines.is_dir() else []:
        if path.name.startswith(".") or not path.is_file():
            continue
        if path.name.endswith(GZ):
            done.gzipped_already += 1
        elif (path.parent.resolve(), path.name.split(".")[0]) in live:
            done.live.append(path.name)
        else:
            gzip_file(path, done)
    return done


def _stems(logs: Iterable[Path]) -> Collection[tuple[Path, str]]:
    out = set()
    for log in logs:
        log = Path(log)
        out.add((log.parent.resolve(), log.name.split(".")[0]))
    return out
