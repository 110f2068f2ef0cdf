"""Troubleshooting from what was stored (Fig 7.1): symptom → the one number or log line to
check → the setting and the page of the manual that fix it.

A diagnosis rule is one decorated function that scans a machine's stored experiments (their
rows, run records, engine logs and the `/metrics` columns the rows keep) and returns a Finding
for every run where its symptom occurred, quoting the number or the log line. Its docstring
states the threshold. Fig 7.1's table is one row per registered rule, so a new rule is a new row::

    @diagnosis("preemptions", symptom="requests are preempted", check="...", fix="...",
               setting="kv_cache_memory_bytes", page="2.2", induce="induce_preemption")
    def _preemptions(stored: Stored) -> list[Finding]:
        '''A load point whose vllm:num_preemptions delta is at least 1.'''

    stored = Stored.load("outputs/cpu")    # every experiment of one machine
    table(stored)                          # one row per rule, with its citation

``induce`` names the part of chapter 7's params (params/ch07.yaml, ch07-h200.yaml) that makes
the symptom happen on purpose: a finding from that part is marked induced.
"""

from __future__ import annotations

import inspect
import json
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.core import schema
from tunebook.core.files import read_stored, read_stored_text
from tunebook.results import stats
from tunebook.results.evidence import Evidence, load_evidence, missing
from tunebook.results.store import find_experiments
from tunebook.servers.startup import get_rule as startup_rule
from tunebook.servers.startup import strip_ansi

# --- what a rule reads ----------------------------------------------------------------------


@dataclass
class Stored:
    """The experiments of one machine's outputs root (outputs/<machine>/), loaded once."""

    root: Path
    experiments: list[Evidence]
    _logs: dict[Path, str] = field(default_factory=dict, repr=False)
    _records: dict[str, dict[tuple[str, str], dict[str, Any]]] = field(default_factory=dict,
                                                                       repr=False)
    _curves: list[Curve] | None = field(default=None, repr=False)

    @classmethod
    def load(cls, root: str | Path) -> Stored:
        root = Path(root)
        return cls(root, [load_evidence(p) for p in find_experiments(root, max_depth=1)])

    @classmethod
    def of(cls, experiments: list[Evidence]) -> Stored:
        """Already-loaded experiments (one, for a single experiment's findings)."""
        root = experiments[0].root.parent if experiments else Path(".")
        return cls(root, list(experiments))

    def get(self, experiment: str) -> Evidence:
        for ev in self.experiments:
            if ev.experiment == experiment:
                return ev
        raise KeyError(f"no experiment {experiment!r} under {self.root}")

    def rows(self, ok_only: bool = False) -> Iterator[tuple[Evidence, pd.DataFrame]]:
        """Each experiment with its rows (the latest attempt per run), or its ok rows."""
        for ev in self.experiments:
            df = ev.ok if ok_only else ev.df
            if len(df):
                yield ev, df

    def record(self, experiment: str, row: pd.Series) -> dict[str, Any] | None:
        """The stored run record (JSON) the row was read from."""
        if experiment not in self._records:
            self._records[experiment] = {
                (str(r["row"].get("run_id")), str(r["row"].get("finished_at"))): r
                for r in self.get(experiment).records if isinstance(r.get("row"), dict)}
        return self._records[experiment].get((str(row["run_id"]), str(row["finished_at"])))

    def _read(self, path: Path) -> str:
        if path not in self._logs:
            try:
                self._logs[path] = strip_ansi(read_stored_text(path))  # plain or .gz
            except OSError:
                self._logs[path] = ""
        return self._logs[path]

    def engine_log(self, experiment: str, row: pd.Series) -> str:
        """The whole log of the engine that served (or failed to start for) the row's run."""
        rec = self.record(experiment, row) or {}
        rel = (rec.get("engine") or {}).get("log")
        return self._read(self.get(experiment).root / rel) if rel else ""

    def _span(self, experiment: str, row: pd.Series, key: str) -> str | None:
        """The bytes of the run's engine log (key "log") or block-table log ("blocks") that
        its load wrote (the record's `log_span`); None when the record has no such span."""
        rec = self.record(experiment, row) or {}
        span = (rec.get("log_span") or {}).get(key)
        rel = (rec.get("engine") or {}).get("log")
        if not (span and rel):
            return None
        path = self.get(experiment).root / rel
        if key == "blocks":
            path = path.with_suffix(".blocks.jsonl")  # the engine's block_table_path
        try:
            data = read_stored(path, int(span[0]), int(span[1]))
        except OSError:
            return ""
        return strip_ansi(data.decode(errors="replace"))

    def run_log(self, experiment: str, row: pd.Series) -> str:
        """The lines of the engine log that the run's own load wrote (its `log_span`); a run
        stored before spans were kept, or a failed one, gives the tail the record kept."""
        text = self._span(experiment, row, "log")
        if text is not None:
            return text
        rec = self.record(experiment, row) or {}
        return strip_ansi(str(rec.get("engine_log_tail") or rec.get("log_tail") or ""))

    def run_steps(self, experiment: str, row: pd.Series) -> list[dict[str, Any]]:
        """The scheduler steps the run's load made, as tunebook.vllm_hooks recorded them (an
        engine started with its BlockTableScheduler); empty otherwise."""
        out = []
        for line in (self._span(experiment, row, "blocks") or "").splitlines():
            try:
                step = json.loads(line)
            except ValueError:
                continue  # a line cut by the span's edge
            if isinstance(step, dict) and step.get("kind") == "step":
                out.append(step)
        return out

    def log_after_run(self, experiment: str, row: pd.Series, max_bytes: int = 1 << 20) -> str:
        """The engine log right after the run's span (vLLM's periodic stats line reports the
        interval the run ended in a few seconds later); empty without a span."""
        rec = self.record(experiment, row) or {}
        span = (rec.get("log_span") or {}).get("log")
        rel = (rec.get("engine") or {}).get("log")
        if not (span and rel):
            return ""
        try:
            data = read_stored(self.get(experiment).root / rel, int(span[1]),
                               int(span[1]) + max_bytes)
        except OSError:
            return ""
        return strip_ansi(data.decode(errors="replace"))


def last_line(text: str, pattern: str, flags: int = 0) -> str | None:
    """The last line of ``text`` matching ``pattern``, stripped."""
    rx = re.compile(pattern, flags)
    return next((ln.strip() for ln in reversed(text.splitlines()) if rx.search(ln)), None)


def first_line(text: str, pattern: str, flags: int = 0) -> str | None:
    """The first line of ``text`` matching ``pattern``, stripped."""
    rx = re.compile(pattern, flags)
    return next((ln.strip() for ln in text.splitlines() if rx.search(ln)), None)


# --- the registry ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """One run where a symptom occurred, with what shows it."""

    rule: str
    experiment: str  # the experiment folder under the machine's outputs root
    run_id: str
    evidence: str  # the number or the log line, quoted
    score: float | None = None  # the checked number ÷ its threshold, ≥ 1 (None: a log line)
    hint: str | None = None  # the fix this run's own numbers suggest
    part: str | None = None  # the params part that planned the run
    induced: bool = False  # the run came from the part of chapter 7's params that induces it


FindFn = Callable[["Stored"], list[Finding]]


@dataclass(frozen=True)
class DiagnosisRule:
    """One row of Fig 7.1: symptom → check → fix, and how to find it in stored runs."""

    name: str
    symptom: str
    check: str  # the one number or log line to look at, and where it is kept
    fix: str  # what to change
    setting: str  # the knob(s)
    page: str  # the manual's figure that explains it
    see_also: tuple[str, ...]
    induce: str | None  # the part of chapter 7's params that induces it
    fn: FindFn = field(repr=False, compare=False)

    @property
    def threshold(self) -> str:
        """The rule's threshold, in words: its docstring."""
        return " ".join(inspect.getdoc(self.fn).split())  # type: ignore[union-attr]

    def find(self, stored: Stored) -> list[Finding]:
        """Every finding, strongest first (by score; log lines keep their order), runs that
        occurred on their own before induced ones."""
        out = [replace(f, rule=self.name, induced=bool(self.induce and f.part == self.induce))
               for f in self.fn(stored)]
        order = {id(f): i for i, f in enumerate(out)}
        return sorted(out, key=lambda f: (f.induced, -(f.score or 0.0), order[id(f)]))


RULES: dict[str, DiagnosisRule] = {}


def diagnosis(name: str, *, symptom: str, check: str, fix: str, setting: str, page: str,
              see_also: tuple[str, ...] = (), induce: str | None = None
              ) -> Callable[[FindFn], FindFn]:
    """Register ``fn(stored) -> list[Finding]`` as the rule ``name`` (a new row of Fig 7.1).
    Refused: a duplicate name, a page the manual lacks, a function without a docstring (the
    threshold is written there)."""
    from tunebook.core import manual  # the manual's tables load pandas frames: import when used

    def register(fn: FindFn) -> FindFn:
        if name in RULES:
            raise ValueError(f"diagnosis rule {name!r} is already registered")
        for fig in (page, *see_also):
            if fig not in manual.FIGURES:
                raise ValueError(f"rule {name!r}: Fig {fig} is not in the manual's index")
        if not inspect.getdoc(fn):
            raise ValueError(f"rule {name!r}: write its threshold in the docstring")
        RULES[name] = DiagnosisRule(name, symptom, check, fix, setting, page, tuple(see_also),
                                    induce, fn)
        return fn

    return register


def unregister(name: str) -> None:
    """Remove a rule (tests add one, then take it away)."""
    RULES.pop(name, None)


def get(name: str) -> DiagnosisRule:
    try:
        return RULES[name]
    except KeyError:
        raise KeyError(f"no diagnosis rule {name!r}; rules: {list(RULES)}") from None


def findings(stored: Stored) -> dict[str, list[Finding]]:
    """Every rule's findings, in registration order."""
    return {name: r.find(stored) for name, r in RULES.items()}


TABLE_COLUMNS = ("rule", "symptom", "check", "fix", "setting", "page", "see_also", "threshold",
                 "seen", "seen_induced", "experiments", "experiment", "run_id", "evidence",
                 "hint", "score", "induced", "induce")


def table(stored: Stored, found: dict[str, list[Finding]] | None = None) -> pd.DataFrame:
    """Fig 7.1's table: one row per rule — the symptom, what to check, the fix and its page —
    citing its best finding (a run that showed it on its own before an induced one) and how
    many runs showed it; a rule nothing showed has no citation."""
    found = findings(stored) if found is None else found
    rows = []
    for name, r in RULES.items():
        fs = found.get(name, [])
        best = fs[0] if fs else None
        rows.append({
            "rule": name, "symptom": r.symptom, "check": r.check, "fix": r.fix,
            "setting": r.setting, "page": r.page, "see_also": ", ".join(r.see_also),
            "threshold": r.threshold, "seen": len(fs),
            "seen_induced": sum(f.induced for f in fs),
            "experiments": ", ".join(sorted({f.experiment for f in fs})),
            "experiment": best.experiment if best else None,
            "run_id": best.run_id if best else None,
            "evidence": best.evidence if best else None,
            "hint": best.hint if best else None,
            "score": best.score if best else None,
            "induced": bool(best.induced) if best else False,
            "induce": r.induce})
    return pd.DataFrame(rows, columns=list(TABLE_COLUMNS))


# --- shared readings ------------------------------------------------------------------------


def _num(v: Any) -> float | None:
    return None if missing(v) else float(v)


def _text(v: Any) -> str | None:
    return None if missing(v) else str(v)


def _part(row: pd.Series) -> str | None:
    return None if missing(row.get("part")) else str(row["part"])


def _finding(ev: Evidence, row: pd.Series, evidence: str, score: float | None = None,
             hint: str | None = None) -> Finding:
    return Finding("", ev.experiment, str(row["run_id"]), evidence, score, hint, _part(row))


@dataclass(frozen=True)
class Curve:
    """The ok load points of one engine config and load shape at growing users (no request
    rate: all at once), means over repeats; ``rows`` holds one row per users value."""

    experiment: Evidence
    label: str
    points: pd.DataFrame  # users, median_ttft_ms, output_tok_s, max_waiting_requests, ...
    rows: pd.DataFrame  # the first stored row at each users value (to cite)


_SHAPE = ("part", "engine_config_id", "dataset", "input_len", "output_len", "prefix_len")


_CURVE_COLS = ("median_ttft_ms", "output_tok_s", "median_tpot_ms", "max_waiting_requests")


def curves(stored: Stored) -> list[Curve]:
    """Concurrency curves: two or more users values of one engine config and load shape.
    Computed once per Stored (two rules read them)."""
    if stored._curves is None:
        stored._curves = list(_curves(stored))
    return stored._curves


def _curves(stored: Stored) -> Iterator[Curve]:
    for ev, ok in stored.rows(ok_only=True):
        ok = ok[_all_at_once(ok) & ok["max_concurrency"].notna()]
        if ok.empty:
            continue
        keys = ok[list(_SHAPE)].astype("string").fillna("")
        # grouped on the few columns a curve needs: taking every row's ~200 columns per group
        # was most of a machine's diagnosis; a curve's cited rows are taken whole at the end
        narrow = ok[["max_concurrency", "repeat", "engine_label", *_CURVE_COLS]]
        for _, idx in keys.groupby(list(_SHAPE), dropna=False).groups.items():
            g = narrow.loc[idx]
            if g["max_concurrency"].nunique() < 2:
                continue
            num = g[["max_concurrency", *_CURVE_COLS]].apply(pd.to_numeric, errors="coerce")
            pts = (num.groupby("max_concurrency").agg(
                {c: ("max" if c == "max_waiting_requests" else "mean") for c in _CURVE_COLS})
                .reset_index().rename(columns={"max_concurrency": "users"})
                .sort_values("users").reset_index(drop=True))
            at = g.sort_values("repeat").drop_duplicates("max_concurrency")
            labels = pd.Series(at.index, index=at["max_concurrency"]).loc[pts["users"]]
            first = ok.loc[labels.to_numpy()].reset_index(drop=True)
            yield Curve(ev, str(g["engine_label"].iloc[0]), pts, first)


def _users(n: float) -> str:
    return f"{int(n)} user{'s' if int(n) != 1 else ''}"


# --- the rules, in the order of Fig 7.1 -----------------------------------------------------

# Memory failures among the failed-start rules (tunebook.servers.startup): the OOM row cites these.
OOM_STARTUP_RULES = ("out_of_memory", "no_cache_memory", "cpu_kv_nothing_left",
                     "cpu_kv_over_free")
_OOM_LINE = r"out of memory|OutOfMemoryError|No available memory for the cache blocks"


def _failed_starts(stored: Stored) -> Iterator[tuple[Evidence, pd.Series]]:
    for ev, df in stored.rows():
        bad = df[df["status"].astype("string").eq(schema.STATUS_ENGINE_FAILED).fillna(False)]
        for _, row in bad.drop_duplicates("engine_config_id").iterrows():
            yield ev, row


@diagnosis("start_fails", symptom="the engine does not start",
           check="the last log line before the start failed (the row's error_line, from the "
                 "engine log)",
           fix="the setting the line names, with a value that works (the row's error_hint)",
           setting="max_model_len | gpu_memory_utilization | kv_cache_dtype | …", page="2.3")
def _start_fails(stored: Stored) -> list[Finding]:
    """An engine config whose start failed (status engine_failed): one finding per engine
    config, quoting the line tunebook.servers.startup diagnosed."""
    return [_finding(ev, row, _text(row["error_line"]) or str(row["error"]),
                     hint=_text(row["error_hint"]))
            for ev, row in _failed_starts(stored)]


@diagnosis("out_of_memory", symptom="out of memory",
           check="the out-of-memory line of the engine log (CUDA out of memory, no memory "
                 "for the cache blocks, the CPU node's KV allocation)",
           fix="a memory fraction that leaves room for the KV cache, smaller weights (FP8) "
               "or more GPUs; the row's error_hint computes the value",
           setting="gpu_memory_utilization | kv_cache_memory_bytes | quantization | "
                   "tensor_parallel_size", page="2.4", see_also=("2.6",))
def _out_of_memory(stored: Stored) -> list[Finding]:
    """A failed start that tunebook.servers.startup's memory rules explain (out_of_memory,
    no_cache_memory, cpu_kv_nothing_left, cpu_kv_over_free), or a run whose engine died with
    an out-of-memory line in its log."""
    memory = {startup_rule(n).symptom for n in OOM_STARTUP_RULES}
    out = [_finding(ev, row, _text(row["error_line"]) or str(row["error"]),
                    hint=_text(row["error_hint"]))
           for ev, row in _failed_starts(stored) if str(row["error"]) in memory]
    for ev, df in stored.rows():
        died = df[df["status"].astype("string").isin(
            [schema.STATUS_FAILED, schema.STATUS_INTERRUPTED]).fillna(False)]
        for _, row in died.iterrows():
            line = last_line(stored.run_log(ev.experiment, row), _OOM_LINE, re.I)
            if line:
                out.append(_finding(ev, row, line, hint="the engine ran out of memory under "
                                    "load: lower max_num_seqs / max_num_batched_tokens or "
                                    "gpu_memory_utilization"))
    return out


TTFT_GROWTH = 3.0


@diagnosis("ttft_grows", symptom="the first token comes later as users are added",
           check="median_ttft_ms at the most users ÷ at the fewest (rows), and "
                 "max_waiting_requests (/metrics)",
           fix="requests waiting: the batch is full, serve fewer users per engine or raise "
               "max_num_seqs; none waiting: new prompts share each step's token budget, "
               "raise max_num_batched_tokens",
           setting="max_num_batched_tokens | max_num_seqs", page="3.4", see_also=("3.1",))
def _ttft_grows(stored: Stored) -> list[Finding]:
    """On a concurrency curve (one engine config, two or more users values), the median TTFT
    at the most users is at least 3× (TTFT_GROWTH) that at the fewest. Cites the run at the
    most users."""
    out = []
    for c in curves(stored):
        p = c.points.dropna(subset=["median_ttft_ms"])
        if len(p) < 2 or not p["median_ttft_ms"].iloc[0] > 0:
            continue
        lo, hi = p.iloc[0], p.iloc[-1]
        ratio = hi["median_ttft_ms"] / lo["median_ttft_ms"]
        if ratio < TTFT_GROWTH:
            continue
        waiting = _num(hi["max_waiting_requests"])
        said = (f"median TTFT {lo['median_ttft_ms']:,.0f} ms at {_users(lo['users'])} → "
                f"{hi['median_ttft_ms']:,.0f} ms at {_users(hi['users'])} ({ratio:.1f}×)")
        if waiting is not None:
            said += (f"; up to {waiting:.0f} requests waited (vllm:num_requests_waiting)"
                     if waiting else "; no request waited (vllm:num_requests_waiting)")
        cap = _num(c.rows.iloc[-1].get("max_num_seqs"))
        if cap and hi["users"] > cap:
            hint = (f"[{c.label}] max_num_seqs={cap:.0f} queues the users past it: raise the "
                    "cap if the KV pool holds them (Fig 3.1)")
        elif waiting:
            hint = (f"[{c.label}] requests queued: the running batch or the KV pool was full "
                    "— fewer users per engine, or more KV memory / a larger max_num_seqs "
                    "(Fig 3.1)")
        elif waiting == 0:
            hint = (f"[{c.label}] nothing queued: new prompts' prefill shares each step's "
                    "token budget with the decoding users — raise max_num_batched_tokens "
                    "(Fig 3.4), or serve fewer users (Fig 5.1's knee)")
        else:
            hint = (f"[{c.label}] users share each step (the run predates the /metrics "
                    "columns that tell queueing apart): serve at the knee (Fig 5.1) or raise "
                    "max_num_batched_tokens (Fig 3.4)")
        row = c.rows.iloc[-1]
        out.append(_finding(c.experiment, row, said, ratio / TTFT_GROWTH, hint))
    return out


FLAT_GAIN = 0.10


@diagnosis("throughput_flat", symptom="throughput stops growing past some users",
           check="output_tok_s from that users value to the most users (rows); the knee "
                 "(stats.saturation)",
           fix="serve at the knee: users past it only queue; more output needs a bigger batch "
               "(max_num_seqs, KV memory) or another engine",
           setting="users (the load) | max_num_seqs", page="5.1", see_also=("3.1",))
def _throughput_flat(stored: Stored) -> list[Finding]:
    """On a concurrency curve, the fewest users u such that no load point past u reaches
    10% (FLAT_GAIN) more output tok/s than u, while the curve reaches at least 2u users.
    Cites the run at u; the score is the 10% bar ÷ the best gain past u."""
    out = []
    for c in curves(stored):
        p = c.points.dropna(subset=["output_tok_s"])
        for i in range(len(p) - 1):
            u, y = p["users"].iloc[i], p["output_tok_s"].iloc[i]
            later = p.iloc[i + 1:]
            if y <= 0 or later["users"].iloc[-1] < 2 * u:
                continue
            gain = later["output_tok_s"].max() / y - 1
            if gain >= FLAT_GAIN:
                continue
            knee = stats.saturation(c.experiment.ok[c.experiment.ok["run_id"].isin(
                _curve_ids(c))], curve_by="engine_label")
            k = knee["knee_x"].iloc[0] if len(knee) else math.nan
            said = (f"output {y:,.0f} tok/s at {_users(u)}; at most "
                    f"{later['output_tok_s'].max():,.0f} tok/s up to "
                    f"{_users(later['users'].iloc[-1])} ({gain:+.0%})")
            cap = _num(c.rows.iloc[i].get("max_num_seqs"))
            hint = (f"[{c.label}] past {_users(u)} added users only wait"
                    + (f" (max_num_seqs={cap:.0f} caps the batch: Fig 3.1)" if cap else "")
                    + (f"; the latency knee (stats.saturation) is at {_users(k)}"
                       if not math.isnan(k) else ""))
            out.append(_finding(c.experiment, c.rows.iloc[i], said,
                                FLAT_GAIN / max(gain, 0.01), hint))
            break
    return out


def _curve_ids(c: Curve) -> set[str]:
    """Run ids of every stored row of the curve's engine config and load shape."""
    ok = c.experiment.ok
    r = c.rows.iloc[0]
    same = pd.Series(True, index=ok.index)
    for k in _SHAPE:
        same &= ok[k].astype("string").fillna("").eq("" if missing(r[k]) else str(r[k]))
    return set(ok.loc[same & _all_at_once(ok), "run_id"])


def _all_at_once(df: pd.DataFrame) -> pd.Series:
    """Rows without a request rate (all requests at once: inf, or <NA> in older rows)."""
    rate = pd.to_numeric(df["request_rate"], errors="coerce")
    return (rate.isna() | rate.map(lambda v: math.isinf(v) if not pd.isna(v) else False)
            ).astype(bool)


_PREEMPT_LINE = r"Preemptions: \d+"
_STATS_LINE = re.compile(r"Running: (\d+) reqs, Waiting: (\d+) reqs")


@diagnosis("preemptions", symptom="requests are preempted",
           check="preemptions (vllm:num_preemptions over the load point, /metrics); in the "
                 "logs, the scheduler steps that preempted and vLLM's 'Running: N reqs, "
                 "Waiting: M reqs, … KV cache usage' line",
           fix="give the KV cache more memory, or admit no more users than the pool holds",
           setting="kv_cache_memory_bytes | gpu_memory_utilization | max_num_seqs", page="2.2",
           see_also=("2.4",), induce="induce_preemption")
def _preemptions(stored: Stored) -> list[Finding]:
    """A load point whose vllm:num_preemptions delta (the row's preemptions) is at least 1;
    for a row without that column, one whose engine log prints 'Preemptions: N' or whose
    recorded scheduler steps preempted. The score is the preemption count. (vLLM 0.32's
    periodic log line never prints its 'Preemptions: N' part: it zeroes the count before
    reading it; the step records of tunebook.vllm_hooks show each preemption instead.)"""
    out = []
    for ev, df in stored.rows():
        for _, row in df.iterrows():
            n = _num(row.get("preemptions"))
            if n is not None and n < 1:
                continue
            log = stored.run_log(ev.experiment, row)
            line = (last_line(log, _PREEMPT_LINE)
                    or first_line(stored.log_after_run(ev.experiment, row), _PREEMPT_LINE))
            steps = [s for s in stored.run_steps(ev.experiment, row) if s.get("preempted")]
            if not n and line is None and not steps:
                continue
            said = (f"{n:.0f} preemptions (vllm:num_preemptions)" if n else
                    f"{len(steps)} scheduler steps preempted" if steps else
                    "the engine log counts preemptions")
            usage = _num(row.get("max_kv_cache_usage"))
            if usage is not None:
                said += f", KV cache {usage:.0%} full at most"
            if steps:
                s0 = steps[0]
                said += (f"; {len(steps)} recorded steps preempted, the first: step "
                         f"{s0.get('step')} preempted {len(s0['preempted'])} request(s) with "
                         f"{s0.get('free_blocks')} blocks free after it")
            if line:
                said += f"; log: {line}"
            else:
                busiest = _busiest_stats_line(log)
                if busiest:
                    said += f"; log: {busiest}"
            out.append(_finding(ev, row, said, n or len(steps) or None, _pool_hint(row)))
    return out


def _busiest_stats_line(log: str) -> str | None:
    """vLLM's periodic stats line with the most requests waiting (the queue behind a full
    pool), trimmed to what follows its 'Engine 000:' prefix."""
    best, most = None, -1
    for ln in log.splitlines():
        m = _STATS_LINE.search(ln)
        if m and int(m.group(2)) > most:
            best, most = ln.strip(), int(m.group(2))
    if best is None:
        return None
    return best.split("Engine 000: ", 1)[-1]


def _pool_hint(row: pd.Series) -> str | None:
    pool, users = _num(row.get("kv_pool_tokens")), _num(row.get("max_concurrency"))
    per = (_num(row.get("input_len")) or 0) + (_num(row.get("output_len")) or 0)
    if not pool or not per or not users:
        return None
    fits = pool / per
    return (f"the pool holds {pool:,.0f} tokens = {fits:.1f} requests of {per:,.0f} tokens, "
            f"and {users:.0f} users ran: give the KV cache {users / fits:.1f}× the memory, or "
            f"cap max_num_seqs at {max(1, math.floor(fits))}")


def _run_timeout(ev: Evidence, part: str | None) -> float | None:
    """The run timeout the stored params gave a part's load points (its own, else the
    file's)."""
    for p in ev.params.get("parts") or ():
        if isinstance(p, dict) and p.get("name") == part and p.get("run_timeout_s"):
            return float(p["run_timeout_s"])
    t = ev.params.get("run_timeout_s")
    return float(t) if isinstance(t, int | float) else None


_HUNG_ERROR = re.compile(r"did not finish within|did not become ready in time|engine exited",
                         re.I)


@diagnosis("hung", symptom="a run hangs (no answer within the timeout)",
           check="the row's error ('did not finish within N s', 'engine exited') and the last "
                 "engine log line its load wrote: a log still stepping means slow, a log that "
                 "stopped means a process hung",
           fix="a load that outlasts run_timeout_s: raise it or shorten the load; a silent "
               "engine: find which of its processes stopped (API server, engine core, worker)",
           setting="run_timeout_s | startup_timeout_s", page="1.2", induce="induce_hang")
def _hung(stored: Stored) -> list[Finding]:
    """A run recorded failed or interrupted because it did not finish within its run
    timeout, or because the engine exited mid-run; or a start that did not become ready
    within startup_timeout_s. Quotes the error and the last engine log line of the run."""
    out = []
    for ev, df in stored.rows():
        bad = df[~df["status"].astype("string").eq(schema.STATUS_OK).fillna(False)]
        for _, row in bad.iterrows():
            err = "" if missing(row["error"]) else str(row["error"])
            if not _HUNG_ERROR.search(err):
                continue
            log = stored.run_log(ev.experiment, row)
            lines = [ln.strip() for ln in log.splitlines() if ln.strip()]
            said = err + (f"; the engine log's last line: {lines[-1][:300]}" if lines else "")
            timeout = _run_timeout(ev, _part(row))
            hint = ("the engine kept writing its log while the client waited: the load "
                    "needed longer than the run timeout" + (f" ({timeout:g} s)" if isinstance(
                        timeout, int | float) else "")
                    if lines else "nothing in the engine log: look for the process that "
                                  "stopped (Fig 1.2)")
            out.append(_finding(ev, row, said, None, hint))
    return out


SLOW_FACTOR = 1.5
# Phases of a start as vLLM reports their durations (seconds), in the order they happen.
_START_PHASES = (
    ("weights", r"(?:Loading weights|Model loading) took (?:[\d.]+ GiB (?:memory )?and )?"
                r"([\d.]+) s"),
    ("torch.compile", r"torch\.compile took ([\d.]+) s in total"),
    ("profiling/warm-up", r"Initial profiling/warmup run took ([\d.]+) s"),
    ("CUDA graphs", r"Graph capturing finished in ([\d.]+) sec"),
    ("engine init", r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s"),
)
_BUSY_WARNING = r"No available shared memory broadcast block found in (\d+) seconds"


def start_phases(log: str) -> dict[str, float]:
    """Seconds per start phase the engine log states (every occurrence summed: a draft
    model loads and warms up too)."""
    out: dict[str, float] = {}
    for name, pat in _START_PHASES:
        vals = [float(m) for m in re.findall(pat, log)]
        if vals:
            out[name] = sum(vals)
    return out


@diagnosis("slow_start", symptom="the engine takes long to start",
           check="startup_s (rows) beside the fastest start of the same model here, and the "
                 "engine log's 'took N s' lines per phase",
           fix="skip compilation and graph capture (enforce_eager) where the compile phase "
               "dominates; start fewer engines at once; raise startup_timeout_s for what is left",
           setting="enforce_eager | start_together | startup_timeout_s", page="4.3",
           see_also=("1.1",))
def _slow_start(stored: Stored) -> list[Finding]:
    """An engine start whose startup_s is at least 1.5× (SLOW_FACTOR) the fastest start of
    the same model on this machine (two starts or more of that model). The score is that
    ratio ÷ 1.5; the log's phase durations say where the time went."""
    starts = []
    for ev, df in stored.rows():
        s = df[pd.to_numeric(df["startup_s"], errors="coerce").notna()]
        for _, row in s.drop_duplicates("engine_config_id").iterrows():
            starts.append((ev, row))
    by_model: dict[str, list[tuple[Evidence, pd.Series]]] = {}
    for ev, row in starts:
        by_model.setdefault(str(row["model"]), []).append((ev, row))
    out = []
    for model, group in by_model.items():
        if len(group) < 2:
            continue
        fast_ev, fast = min(group, key=lambda er: float(er[1]["startup_s"]))
        for ev, row in group:
            ratio = float(row["startup_s"]) / float(fast["startup_s"])
            if ratio < SLOW_FACTOR:
                continue
            log = stored.engine_log(ev.experiment, row)
            phases = start_phases(log)
            said = (f"startup_s {row['startup_s']:,.0f} s, {ratio:.1f}× the fastest {model} "
                    f"start here ({fast['startup_s']:,.0f} s: {fast_ev.experiment}, "
                    f"{fast['engine_label']})")
            if phases:
                said += "; log: " + ", ".join(f"{k} {v:,.0f} s" for k, v in phases.items())
            busy = len(re.findall(_BUSY_WARNING, log))
            if busy:
                said += (f"; vLLM warned {busy}× 'No available shared memory broadcast block "
                         "found in 60 seconds' (a process busy for a minute)")
            out.append(_finding(ev, row, said, ratio / SLOW_FACTOR,
                                _slow_hint(row, phases)))
    return out


def _slow_hint(row: pd.Series, phases: dict[str, float]) -> str:
    together = _num(row.get("engines_started_together"))
    parts = []
    slow = {k: v for k, v in phases.items() if k != "engine init"}
    top = max(slow, key=lambda k: slow[k]) if slow else None
    if top in ("torch.compile", "CUDA graphs"):
        parts.append(f"{top} took the most: enforce_eager: true skips it (Fig 4.3: a few "
                     "percent per token)")
    elif top:
        parts.append(f"{top} took the most ({slow[top]:,.0f} s)")
    if together and together > 1:
        parts.append(f"{together:.0f} engines started together and shared the CPU: start "
                     "fewer at once")
    return "; ".join(parts) or "read the engine log's phase lines"

