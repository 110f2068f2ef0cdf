"""Statistics of repeated runs: means with Student-t intervals, "within noise", and the
throughput peak and latency knee of a load sweep. Pure functions of a results frame.

    stats.summarize(df, ["engine_label", "max_concurrency"], "output_tok_s")
    a = stats.interval(df, "output_tok_s", {"engine_label": "default", "max_concurrency": 32})
    stats.within_noise(a, b)            # the two 95% intervals overlap
    stats.ratio(a, b)                   # a ÷ b with an interval
    stats.saturation(df)                # per curve: peak_x/peak_y and knee_x/knee_y

Only ok rows count (``store.ok_rows``). One run gives a mean but no interval: its bounds are
NaN, never invented. No scipy: the Student-t quantile is computed here (exact, integer df).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from tunebook.results.store import ok_rows

CONFIDENCE = 0.95
SUMMARY_COLUMNS = ("n", "mean", "std", "ci_low", "ci_high", "half_width")

# --- Student's t, without scipy -----------------------------------------------------------


def _t_central(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4: a
    finite series in θ = atan(t/√df), exact for integer df)."""
    theta = math.atan(t / math.sqrt(df))
    s, c2 = math.sin(theta), math.cos(theta) ** 2
    if df % 2:  # odd: (2/π)(θ + sinθ·(cosθ + 2/3 cos³θ + … + cos^(df-2)θ))
        term, total = math.cos(theta), 0.0
        for j in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c2 * (2 * j) / (2 * j + 1)
        return (2 / math.pi) * (theta + s * total)
    term, total = 1.0, 0.0  # even: sinθ·(1 + 1/2 cos²θ + 1·3/2·4 cos⁴θ + … + cos^(df-2)θ)
    for j in range(1, df // 2 + 1):
        total += term
        term *= c2 * (2 * j - 1) / (2 * j)
    return s * total


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, df: int) -> float:
    """The two-sided Student-t critical value: P(|T| <= t) = ``confidence`` with ``df``
    degrees of freedom (t_quantile(0.95, 4) = 2.776). Bisection on θ = atan(t/√df)."""
    _check_confidence(confidence)
    if int(df) != df or df < 1:
        raise ValueError(f"degrees of freedom must be a whole number >= 1, not {df!r}")
    df = int(df)
    lo, hi = 0.0, math.pi / 2
    for _ in range(200):  # P(|T| <= √df·tanθ) rises with θ; 200 halvings reach float precision
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _t_central(math.sqrt(df) * math.tan(mid), df) < confidence \
            else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (0.95 = 95%), not {confidence!r}")


# --- one interval -------------------------------------------------------------------------


def _finite(v: Any) -> bool:
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` repeats and its two-sided Student-t interval.

    ``low``/``high`` are NaN when ``n`` < 2 (one run says nothing about noise); ``mean`` is
    NaN when ``n`` = 0."""

    mean: float
    low: float = math.nan
    high: float = math.nan
    n: int = 1
    std: float = math.nan
    confidence: float = CONFIDENCE

    @classmethod
    def of(cls, values: Iterable[Any], confidence: float = CONFIDENCE) -> Interval:
        """The interval of the finite numbers among ``values`` (None/NaN/inf are skipped)."""
        _check_confidence(confidence)
        xs = [float(v) for v in values if _finite(v)]
        n = len(xs)
        if n == 0:
            return cls(math.nan, n=0, confidence=confidence)
        mean = math.fsum(xs) / n
        if n == 1:
            return cls(mean, n=1, confidence=confidence)
        std = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
        half = t_quantile(confidence, n - 1) * std / math.sqrt(n)
        return cls(mean, mean - half, mean + half, n, std, confidence)

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | pd.Series,
                 confidence: float = CONFIDENCE) -> Interval:
        """The interval of one row of :func:`summarize`."""
        n = int(row["n"])
        return cls(float(row["mean"]), float(row["ci_low"]), float(row["ci_high"]), n,
                   float(row["std"]), confidence)

    @property
    def known(self) -> bool:
        """True when there is an interval (n >= 2 and finite bounds)."""
        return self.n >= 2 and _finite(self.low) and _finite(self.high)

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2 if self.known else math.nan

    def contains(self, value: float) -> bool:
        """``value`` lies inside the interval (False when there is no interval)."""
        return self.known and self.low <= value <= self.high

    def text(self, unit: str = "", digits: int = 3) -> str:
        """``180 ± 12.4 tok/s (95% CI, 3 runs)``; ``0.64× (0.59–0.69×, 95% CI, 3 runs)``
        where the interval is lopsided (a ratio's); ``180 tok/s (1 run, no interval)``; or
        ``not measured``."""
        if self.n == 0 or not _finite(self.mean):
            return "not measured"
        u = f" {unit}" if unit and unit != "x" else ""
        x = "×" if unit == "x" else ""

        def num(v: float) -> str:
            return f"{v:,.{digits}g}" if abs(v) < 10 ** digits else f"{v:,.0f}"

        if not self.known:
            return f"{num(self.mean)}{x}{u} (1 run, no interval)" if self.n == 1 else \
                f"{num(self.mean)}{x}{u} ({self.n} runs, no interval)"
        ci = f"{self.confidence:.0%} CI, {self.n} runs"
        if abs((self.high - self.mean) - (self.mean - self.low)) <= 0.01 * self.half_width:
            return f"{num(self.mean)} ± {num(self.half_width)}{x}{u} ({ci})"
        return f"{num(self.mean)}{x}{u} ({num(self.low)}–{num(self.high)}{x}, {ci})"  # lopsided


def interval(df: pd.DataFrame, metric: str, where: Mapping[str, Any] | None = None,
             confidence: float = CONFIDENCE) -> Interval:
    """The interval of ``metric`` over the ok rows matching ``where`` ({column: value}; a
    value of None matches a missing cell, e.g. the default of an unset knob)."""
    _require(df, metric, *(where or {}))
    rows = ok_rows(df)
    for col, want in (where or {}).items():
        rows = rows[_matches(rows[col], want)]
    return Interval.of(pd.to_numeric(rows[metric], errors="coerce"), confidence)


def _matches(column: pd.Series, want: Any) -> pd.Series:
    """Cells equal to ``want``: None matches a missing cell; numbers compare as numbers (32
    matches 32.0), anything else as text."""
    if want is None:
        return column.isna()
    if isinstance(want, int | float) and not isinstance(want, bool):
        numbers = pd.to_numeric(column, errors="coerce")
        return numbers.eq(want).fillna(False).astype(bool)
    return column.astype("string").eq(str(want)).fillna(False).astype(bool)


# --- many intervals -----------------------------------------------------------------------


def _require(df: pd.DataFrame, *columns: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"results frame lacks columns {missing}")


def describe(df: pd.DataFrame, by: Sequence[str], metric: str,
             confidence: float = CONFIDENCE) -> pd.DataFrame:
    """:func:`summarize` over rows already chosen (no status filter): for frames that are not
    results tables, such as a chart's long frame."""
    _check_confidence(confidence)
    by = list(by)
    _require(df, *by, metric)
    values = pd.to_numeric(df[metric], errors="coerce").astype("float64")
    frame = df[by].assign(_v=values)[values.map(_finite)]
    if frame.empty:
        return pd.DataFrame({**{c: df[c].iloc[0:0] for c in by},
                             **{c: pd.Series(dtype="float64") for c in SUMMARY_COLUMNS}})
    if not by:  # one group: everything
        frame = frame.assign(_all=0)
    grouped = frame.groupby(by or ["_all"], dropna=False, sort=True)["_v"]
    out = grouped.agg(n="count", mean="mean", std="std").reset_index()
    if not by:
        out = out.drop(columns="_all")
    t = out["n"].map(lambda n: t_quantile(confidence, n - 1) if n >= 2 else math.nan)
    half = (t * out["std"] / out["n"].astype(float) ** 0.5).where(out["n"] >= 2)
    out["std"] = out["std"].where(out["n"] >= 2)
    out["half_width"] = half
    out["ci_low"], out["ci_high"] = out["mean"] - half, out["mean"] + half
    return out[[*by, *SUMMARY_COLUMNS]]


def summarize(df: pd.DataFrame, by: Sequence[str], metric: str,
              confidence: float = CONFIDENCE) -> pd.DataFrame:
    """One row per group of ``by`` over the ok rows: columns ``by`` + n, mean, std, ci_low,
    ci_high, half_width.

    The interval is the two-sided Student-t interval of the mean, mean ± t(confidence, n-1) ·
    std / √n, with std the sample standard deviation (n-1). With n = 1 std, ci_low, ci_high and
    half_width are NaN: one run measures no noise. Groups with no ok finite value are absent;
    a missing ``by`` value (an unset knob) is a group of its own."""
    return describe(ok_rows(df), by, metric, confidence)


# --- comparing intervals ------------------------------------------------------------------


def within_noise(a: Interval, b: Interval) -> bool:
    """True when the difference between ``a`` and ``b`` is within noise: both have an
    interval (n >= 2) and the two intervals overlap.

    Why overlap and not a t-test: it is the rule a reader can check on the chart (the bars
    touch), and it errs on the side of "within noise" — two 95% intervals that do not overlap
    mean a difference significant at well under 5% (about 0.6% for equal widths), so a
    "differs" is never a noise artefact. Overlap does not prove equality; it says these
    repeats cannot tell the two apart. It agrees with :func:`ratio`: the bounds interval of
    a ÷ b contains 1 exactly when the intervals overlap. Without an interval on either side
    (one run) it is False: noise was not measured, and callers must say so."""
    return a.known and b.known and a.low <= b.high and b.low <= a.high


def ratio(a: Interval, b: Interval, method: str = "bounds", dof: str = "welch") -> Interval:
    """``a`` ÷ ``b`` (positive quantities: throughputs, latencies) with an interval.

    ``method="bounds"`` (default): [a.low / b.high, a.high / b.low] — every ratio the two
    intervals allow; conservative (its coverage is at least that of each input) and it
    contains 1 exactly when :func:`within_noise` holds. ``method="delta"``: the delta method,
    mean ± t·r·√((s_a/(√n_a·m_a))² + (s_b/(√n_b·m_b))²) with Welch–Satterthwaite degrees of
    freedom rounded down (narrower; assumes small relative errors).

    ``dof="hsu"`` (delta method only): the smaller side's n − 1 degrees of freedom instead,
    conservative where the sides differ in size (Welch's approximation lets through about 6×
    its nominal rate at 99.75 % with 3 runs against 15: tunebook.present.history pools
    unequal sides).

    The bounds are NaN when either side lacks an interval, and for the bounds method when b's
    interval reaches 0 or below, or a's falls below 0 (that quotient is then unbounded or
    meaningless). The delta method needs only b's mean positive: a wide interval of few
    repeats at a family-wise confidence may reach 0 and still say what the ratio is."""
    if method not in ("bounds", "delta"):
        raise ValueError(f"method must be 'bounds' or 'delta', not {method!r}")
    if a.confidence != b.confidence:
        raise ValueError(f"intervals of different confidence ({a.confidence}, {b.confidence})")
    n = min(a.n, b.n)
    if not (_finite(a.mean) and _finite(b.mean)) or b.mean == 0:
        return Interval(math.nan, n=n, confidence=a.confidence)
    r = a.mean / b.mean
    if not (a.known and b.known):
        return Interval(r, n=n, confidence=a.confidence)
    if method == "bounds":
        if b.low <= 0 or a.low < 0:  # the interval of a quotient of intervals: unbounded
            return Interval(r, n=n, confidence=a.confidence)
        return Interval(r, a.low / b.high, a.high / b.low, n, confidence=a.confidence)
    va = (a.std / a.mean) ** 2 / a.n  # squared relative standard errors
    vb = (b.std / b.mean) ** 2 / b.n
    if va + vb == 0:
        return Interval(r, r, r, n, confidence=a.confidence)
    if dof == "hsu":
        df = float(min(a.n, b.n) - 1)
    else:
        df = (va + vb) ** 2 / (va ** 2 / (a.n - 1) + vb ** 2 / (b.n - 1))
    half = t_quantile(a.confidence, max(1, math.floor(df))) * abs(r) * math.sqrt(va + vb)
    return Interval(r, r - half, r + half, n, confidence=a.confidence)


def pooled_ratio(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
                 ) -> Interval:
    """The geometric mean of positive values ``a`` ÷ that of ``b``, with Student's
    equal-variance interval on the logs: both sides' spreads pooled, n_a + n_b − 2 degrees of
    freedom, so one side may be a single value judged against the other's spread (a
    prediction interval). Right where both sides come from one process under the hypothesis
    tested and its noise multiplies (a box's measurements where nothing recorded changed,
    tunebook.present.history); on the logs it is exact for log-normal noise, and its bounds
    stay positive where a delta method's symmetric interval of a quotient can fall below 0.
    Its n: the values of both sides, on which the one pooled spread rests."""
    _check_confidence(confidence)
    la = [math.log(float(v)) for v in a if _finite(v) and float(v) > 0]
    lb = [math.log(float(v)) for v in b if _finite(v) and float(v) > 0]
    n = len(la) + len(lb)
    if not (la and lb):
        return Interval(math.nan, n=n, confidence=confidence)
    ma, mb = math.fsum(la) / len(la), math.fsum(lb) / len(lb)
    r, df = math.exp(ma - mb), n - 2
    if df < 1:
        return Interval(r, n=n, confidence=confidence)
    var = (math.fsum((x - ma) ** 2 for x in la) + math.fsum((x - mb) ** 2 for x in lb)) / df
    half = t_quantile(confidence, df) * math.sqrt(var * (1 / len(la) + 1 / len(lb)))
    return Interval(r, math.exp(ma - mb - half), math.exp(ma - mb + half), n,
                    confidence=confidence)


# --- how many samples a percentile rests on ------------------------------------------------
# A pXX from n samples is an order statistic: with fewer than MIN_SAMPLES[pXX] of them (fewer
# than 1 sample above it on average: n × (1 − q) < 1) it is the largest sample or next to it,
# and says more about one outlier than about a tail (vllm-project/guidellm#243).
MIN_SAMPLES = {"p90": 10, "p95": 20, "p99": 100, "p999": 1000}


def percentile_of(column: str) -> str | None:
    """'p99' for p99_ttft_ms, None for a column that is no percentile."""
    head = column.split("_", 1)[0]
    return head if head in MIN_SAMPLES else None


def samples_of(column: str, row: Mapping[str, Any]) -> float | None:
    """How many samples a run's percentile column rests on: the requests that completed (TTFT,
    TPOT, E2EL are one per request), or the inter-token gaps for ITL (output tokens less one
    per request)."""
    done = row.get("completed")
    if not _finite(done):
        return None
    if "_itl_" in column:
        out = row.get("total_output_tokens")
        return float(out) - float(done) if _finite(out) else None
    return float(done)


def too_few(column: str, n: float | None) -> bool:
    """True when a percentile column rests on fewer samples than it needs (MIN_SAMPLES)."""
    p = percentile_of(column)
    return p is not None and n is not None and n < MIN_SAMPLES[p]


# --- peak and knee of a load sweep --------------------------------------------------------

KNEE_FOUND = "found"
KNEE_BEYOND = "beyond the measured range"
KNEE_SINGLE = "single point"
KNEE_NO_DATA = "no data"
MIN_MARGINAL_FRACTION = 0.5
MAX_LATENCY_MULTIPLE = 2.0
SATURATION_COLUMNS = (
    "points", "base_x", "base_y", "base_y_per_x", "base_latency",
    "peak_x", "peak_y", "peak_low", "peak_high", "peak_n", "peak_latency", "peak_at_edge",
    "near_peak_x", "knee_x", "knee_y", "knee_latency", "knee_status", "knee_reason",
    "min_marginal_fraction", "max_latency_multiple", "rule",
)
_X_UNIT = {"max_concurrency": ("user", "users"), "request_rate": ("req/s", "req/s")}


def _unit(x: str) -> tuple[str, str]:
    return _X_UNIT.get(x, (x, x))


def _num(v: float) -> str:
    return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def knee_rule(x: str = "max_concurrency", y: str = "output_tok_s",
              latency: str | None = "median_tpot_ms",
              min_marginal_fraction: float = MIN_MARGINAL_FRACTION,
              max_latency_multiple: float = MAX_LATENCY_MULTIPLE) -> str:
    """The peak and knee rules in words, with their thresholds."""
    one, _ = _unit(x)
    lat = (f", or {latency} rises past {max_latency_multiple:g}× its value at the lowest load"
           if latency else "")
    return (f"peak: the load point with the highest mean {y}. knee: scanning up from the "
            f"lowest load, the last point before the first step where one more {one} adds "
            f"less than {min_marginal_fraction:.0%} of the lowest load's {y} per {one}{lat}")


def saturation(df: pd.DataFrame, x: str = "max_concurrency", y: str = "output_tok_s",
               latency: str | None = "median_tpot_ms", curve_by: str = "engine_label",
               min_marginal_fraction: float = MIN_MARGINAL_FRACTION,
               max_latency_multiple: float = MAX_LATENCY_MULTIPLE,
               confidence: float = CONFIDENCE) -> pd.DataFrame:
    """The throughput peak and the latency knee of each curve (one per ``curve_by`` value),
    from the means over repeats of the ok rows at each load point ``x``.

    **Peak**: the load point with the highest mean ``y`` (ties: the lower load). It is only
    where throughput tops out; past it users just queue.

    **Knee**: scanning up from the lowest load x₀ (throughput y₀, latency L₀), the last point
    before the first step xᵢ₋₁ → xᵢ where either
      (a) the added throughput per added unit of load, (yᵢ − yᵢ₋₁)/(xᵢ − xᵢ₋₁), falls under
          ``min_marginal_fraction`` (50%) of the lowest load's rate y₀/x₀ — one more user
          buys less than half of what the first users got each; or
      (b) ``latency`` at xᵢ exceeds ``max_latency_multiple`` (2×) L₀ — each user's tokens
          come at more than twice the unloaded pace.
    Why this rule: it is the point where adding users stops buying throughput at a bounded
    latency cost. GuideLLM anchors its sweeps on the same low-load rate (its synchronous,
    one-user run) and the saturated throughput; AIPerf judges load points by latency
    objectives (goodput) — the manual states none, so (b) bounds latency relative to the
    unloaded value, the usual reading of "the latency knee". Past saturation (Little's law)
    throughput is flat, so (a) fails, while latency grows with each user, so (b) fails: with
    a positive fraction the knee is never past the peak, and usually well before it.

    Returned, one row per curve: ``curve_by``, points (load points with a mean), base_x,
    base_y, base_y_per_x, base_latency; peak_x, peak_y, peak_low, peak_high (the peak's
    interval, NaN with one run), peak_n, peak_latency, peak_at_edge (the peak is the largest
    load measured: the true peak may lie beyond), near_peak_x (tuple of the loads whose
    interval overlaps the peak's: within noise of it); knee_x, knee_y, knee_latency,
    knee_status (``found``; ``beyond the measured range`` when no step fails — knee_x is then
    NaN, the knee lies at or past the largest load; ``single point``; ``no data``),
    knee_reason (what failed at the step past the knee), min_marginal_fraction,
    max_latency_multiple and rule (:func:`knee_rule`).

    Points without a mean ``y`` are skipped; when ``latency`` is None, absent, or unmeasured
    at the lowest load, only (a) applies (knee_reason says so); a point whose latency is
    missing is skipped for the knee scan (it cannot show a bounded latency)."""
    _check_confidence(confidence)
    if not min_marginal_fraction >= 0 or not max_latency_multiple >= 1:
        raise ValueError("min_marginal_fraction must be >= 0 and max_latency_multiple >= 1")
    _require(df, x, y, curve_by)
    ok = ok_rows(df)
    ok = ok[pd.to_numeric(ok[x], errors="coerce").map(_finite)] if len(ok) else ok
    use_latency = latency is not None and latency in df.columns
    ys = summarize(ok, [curve_by, x], y, confidence)
    lats = (summarize(ok, [curve_by, x], latency, confidence)[[curve_by, x, "mean"]]
            .rename(columns={"mean": "lat"}) if use_latency else None)
    rule = knee_rule(x, y, latency if use_latency else None, min_marginal_fraction,
                     max_latency_multiple)
    rows = []
    for label in ok[curve_by].drop_duplicates().sort_values(na_position="last"):
        pts = ys[ys[curve_by].isna()] if pd.isna(label) else ys[ys[curve_by] == label]
        if lats is not None:
            lab = lats[lats[curve_by].isna()] if pd.isna(label) else lats[lats[curve_by] == label]
            pts = pts.merge(lab[[x, "lat"]], on=x, how="left")
        else:
            pts = pts.assign(lat=math.nan)
        pts = pts.assign(_x=pd.to_numeric(pts[x]).astype(float)).sort_values("_x")
        row = _one_curve(pts, x, y, min_marginal_fraction, max_latency_multiple, lats is not None)
        rows.append({curve_by: label, **row, "min_marginal_fraction": min_marginal_fraction,
                     "max_latency_multiple": max_latency_multiple, "rule": rule})
    return pd.DataFrame(rows, columns=[curve_by, *SATURATION_COLUMNS])


def _one_curve(pts: pd.DataFrame, x: str, y: str, frac: float, mult: float,
               has_latency: bool) -> dict[str, Any]:
    nan = math.nan
    out: dict[str, Any] = dict(points=len(pts), base_x=nan, base_y=nan, base_y_per_x=nan,
                               base_latency=nan, peak_x=nan, peak_y=nan, peak_low=nan,
                               peak_high=nan, peak_n=0, peak_latency=nan, peak_at_edge=False,
                               near_peak_x=(), knee_x=nan, knee_y=nan, knee_latency=nan,
                               knee_status=KNEE_NO_DATA, knee_reason="no load point has a mean")
    if pts.empty:
        return out
    one, many = _unit(x)
    top = pts.loc[pts["mean"].idxmax()]  # idxmax: the first (lowest load) of tied maxima
    peak = Interval.from_row(top)
    out.update(peak_x=float(top["_x"]), peak_y=peak.mean, peak_low=peak.low,
               peak_high=peak.high, peak_n=peak.n, peak_latency=float(top["lat"]),
               peak_at_edge=bool(top["_x"] == pts["_x"].iloc[-1]),
               near_peak_x=tuple(float(r["_x"]) for _, r in pts.iterrows()
                                 if r["_x"] == top["_x"]
                                 or within_noise(Interval.from_row(r), peak)))
    base = pts.iloc[0]
    x0, y0, lat0 = float(base["_x"]), float(base["mean"]), float(base["lat"])
    out.update(base_x=x0, base_y=y0, base_y_per_x=y0 / x0 if x0 > 0 else nan,
               base_latency=lat0)
    check_latency = has_latency and _finite(lat0) and lat0 > 0
    scan = pts[pts["lat"].map(_finite)] if check_latency else pts
    note = "" if check_latency else (
        "; latency not checked (not measured at the lowest load)" if has_latency
        else "; latency not checked (no latency column)")
    if len(pts) == 1:
        out.update(knee_status=KNEE_SINGLE,
                   knee_reason=f"one load point ({_num(x0)} {many}): no step to judge")
        return out
    if not x0 > 0:
        out.update(knee_status=KNEE_NO_DATA,
                   knee_reason=f"the lowest load is {_num(x0)} {many}: no per-{one} rate")
        return out
    rate0 = y0 / x0
    knee = scan.iloc[0]
    reason = ""
    for i in range(1, len(scan)):
        prev, cur = scan.iloc[i - 1], scan.iloc[i]
        step = f"from {_num(prev['_x'])} to {_num(cur['_x'])} {many}"
        marginal = (cur["mean"] - prev["mean"]) / (cur["_x"] - prev["_x"])
        failed = []
        if not marginal >= frac * rate0:
            failed.append(f"one more {one} added {_num(marginal)} {y} ({marginal / rate0:.2f}× "
                          f"the {_num(rate0)} per {one} at {_num(x0)} {one if x0 == 1 else many};"
                          f" the bar is {frac:.0%})")
        if check_latency and not cur["lat"] <= mult * lat0:
            failed.append(f"latency {cur['lat'] / lat0:.2f}× its lowest-load value "
                          f"(the bar is {mult:g}×)")
        if failed:
            reason = f"{step}: " + " and ".join(failed)
            break
        knee = cur
    else:
        out.update(knee_status=KNEE_BEYOND,
                   knee_reason=f"every step up to {_num(scan['_x'].iloc[-1])} {many} kept "
                               f"both bars: the knee is at or beyond the largest load" + note)
        return out
    out.update(knee_x=float(knee["_x"]), knee_y=float(knee["mean"]),
               knee_latency=float(knee["lat"]), knee_status=KNEE_FOUND,
               knee_reason=reason + note)
    return out


__all__ = [
    "CONFIDENCE", "KNEE_BEYOND", "KNEE_FOUND", "KNEE_NO_DATA", "KNEE_SINGLE",
    "MAX_LATENCY_MULTIPLE", "MIN_MARGINAL_FRACTION", "SATURATION_COLUMNS", "SUMMARY_COLUMNS",
    "Interval", "describe", "interval", "knee_rule", "ratio", "saturation", "summarize",
    "t_quantile", "within_noise",
]
