"""Fig 6.2's table, rule and chart from stored rows (tunebook.figures.ch06_layouts'
PrefillDecodeSplit calls these; its rule's docstring states the rule).

A disaggregated row (``disaggregated`` true, written by a tunebook.disagg pair) is set beside the
single engine's row at the same load point (dataset, users, rate, prompt and output lengths).
What crossed is checked against what the connector should move, block by block: ExampleConnector
stores a prompt of n tokens as its first ⌊(n−1)/B⌋·B tokens (B = the KV block size) and the
decode engine loads ⌊(n−2)/B⌋·B of them (vLLM's example_connector.py, align_to_block_size over
the prompt, and over the prompt less its last token); the rest is computed where it lands. A
request whose prompt the decode engine already holds (the client's warm-ups repeat its first
prompt) is served from the decode engine's own prefix cache and loads nothing: loaded plus
locally cached tokens must cover the requests.
"""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

from tunebook import charts
from tunebook.evidence import DIFFERS, HOLDS, NOT_MEASURED, Evidence, missing, times

# What crossed must match what should have, within this fraction (file headers, prompts whose
# re-tokenised length moved a block boundary).
MATCH_TOLERANCE = 0.10
# A latency ratio counts as a win or a loss past this margin (single runs: no noise measured).
WIN_MARGIN = 0.10
LOAD_KEYS = ("dataset", "max_concurrency", "request_rate", "input_len", "output_len",
             "prefix_len")
COLUMNS = [
    "engine_label", "kv_connector", "users", "request_rate", "input_len", "output_len",
    "requests", "prompt_tokens", "block", "kv_bytes_per_token", "kv_bytes", "prompts_stored",
    "bytes_per_prompt", "expected_bytes_per_prompt", "bytes_ratio", "loaded_tokens",
    "decode_cached_tokens", "expected_loaded_tokens", "loaded_ratio", "prefill_ratio",
    "completed", "num_prompts", "output_tokens", "median_prefill_ms", "median_decode_first_byte_ms",
    "mean_proxy_overhead_ms", "median_ttft_ms", "single_median_ttft_ms", "ttft_ratio",
    "median_itl_ms", "single_median_itl_ms", "median_itl_ratio", "p99_itl_ms",
    "single_p99_itl_ms", "p99_itl_ratio"]


def stored_tokens(n: float, block: int) -> int:
    """Tokens of an n-token prompt ExampleConnector stores: ⌊(n−1)/B⌋·B."""
    return max(0, int(n - 1) // block * block)


def loaded_tokens(n: float, block: int) -> int:
    """Tokens of an n-token prompt the decode engine loads: ⌊(n−2)/B⌋·B."""
    return max(0, int(n - 2) // block * block)


def _flag(s: pd.Series) -> pd.Series:
    return s.map(lambda v: False if missing(v) else str(v).lower() in ("true", "1"))


def _num(row: pd.Series, col: str) -> float:
    v = row.get(col)
    return math.nan if missing(v) else float(v)


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def table(ev: Evidence) -> pd.DataFrame:
    """One row per disaggregated config and load point (repeats averaged): what crossed, what
    should have, and the latencies beside the single engine's at the same load."""
    ok = ev.ok
    if ok.empty or "disaggregated" not in ok.columns:
        return pd.DataFrame(columns=COLUMNS)
    pair_mask = _flag(ok["disaggregated"])
    pairs, singles = ok[pair_mask], ok[~pair_mask]
    if pairs.empty:
        return pd.DataFrame(columns=COLUMNS)
    keys = [k for k in LOAD_KEYS if k in ok.columns]

    def means(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
        num = df.select_dtypes("number").columns.difference(by)
        return df.groupby(by, dropna=False)[list(num)].mean().reset_index()

    single = means(singles, keys) if len(singles) else pd.DataFrame(columns=keys)
    rows = []
    for (label, connector), g in pairs.groupby(["engine_label", "kv_connector"], dropna=False):
        for _, p in means(g, keys).iterrows():
            match = single
            for k in keys:
                match = match[match[k].isna()] if missing(p[k]) else match[match[k] == p[k]]
            s = match.iloc[0] if len(match) else pd.Series(dtype=float)
            requests = _num(p, "proxy_requests")
            block = _num(p, "kv_block_size")
            n = _num(p, "engine_prompt_tokens") / requests if requests else math.nan
            per_token = _num(p, "kv_bytes_per_token")
            stored = _num(p, "kv_prompts_stored")
            ok_n = math.isfinite(n) and math.isfinite(block) and block > 0
            exp_bytes = stored_tokens(n, int(block)) * per_token if ok_n else math.nan
            exp_loaded = requests * loaded_tokens(n, int(block)) if ok_n else math.nan
            kv_bytes = _num(p, "kv_bytes_transferred")
            cached = _num(p, "prefix_cache_hit_tokens")  # the decode engine's own cache
            cached = 0.0 if math.isnan(cached) else cached
            per_prompt = kv_bytes / stored if stored else math.nan
            row = {
                "engine_label": label, "kv_connector": connector,
                "users": p.get("max_concurrency"), "request_rate": p.get("request_rate"),
                "input_len": p.get("input_len"), "output_len": p.get("output_len"),
                "requests": requests, "prompt_tokens": n, "block": block,
                "kv_bytes_per_token": per_token, "kv_bytes": kv_bytes, "prompts_stored": stored,
                "bytes_per_prompt": per_prompt, "expected_bytes_per_prompt": exp_bytes,
                "bytes_ratio": _ratio(per_prompt, exp_bytes),
                "loaded_tokens": _num(p, "kv_loaded_tokens"),
                "decode_cached_tokens": cached,
                "expected_loaded_tokens": exp_loaded,
                "loaded_ratio": _ratio(_num(p, "kv_loaded_tokens") + cached, exp_loaded),
                "prefill_ratio": _ratio(_num(p, "prefill_prompt_tokens"),
                                        requests * n if math.isfinite(n) else math.nan),
                "completed": _num(p, "completed"), "num_prompts": _num(p, "num_prompts"),
                "output_tokens": _num(p, "total_output_tokens"),
                "median_prefill_ms": _num(p, "median_prefill_ms"),
                "median_decode_first_byte_ms": _num(p, "median_decode_first_byte_ms"),
                "mean_proxy_overhead_ms": _num(p, "mean_proxy_overhead_ms"),
            }
            for col, name in (("median_ttft_ms", "ttft_ratio"),
                              ("median_itl_ms", "median_itl_ratio"),
                              ("p99_itl_ms", "p99_itl_ratio")):
                row[col] = _num(p, col)
                row[f"single_{col}"] = _num(s, col) if len(s) else math.nan
                row[name] = _ratio(row[col], row[f"single_{col}"])
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _load(r: pd.Series) -> str:
    rate = r["request_rate"]
    at = "all at once" if missing(rate) or math.isinf(rate) else f"{float(rate):g} req/s"
    return f"{int(r['users'])} users, {at}, {int(r['input_len'])}+{int(r['output_len'])} tok"


def mechanism(r: pd.Series) -> list[str]:
    """What a disaggregated load point did not do, in words (empty: the mechanism held)."""
    bad = []
    if not (abs(r["bytes_ratio"] - 1) <= MATCH_TOLERANCE):
        bad.append(f"{charts.fmt(r['bytes_per_prompt'])} B crossed per stored prompt, "
                   f"expected {charts.fmt(r['expected_bytes_per_prompt'])} B "
                   f"({times(r['bytes_ratio'])})")
    if not (abs(r["loaded_ratio"] - 1) <= MATCH_TOLERANCE) or not r["loaded_tokens"] > 0:
        bad.append(f"the decode engine loaded {charts.fmt(r['loaded_tokens'])} prompt tokens "
                   f"through the connector (and had {charts.fmt(r['decode_cached_tokens'])} "
                   f"cached), expected {charts.fmt(r['expected_loaded_tokens'])} in all "
                   f"({times(r['loaded_ratio'])})")
    if not (r["prefill_ratio"] >= 1 - MATCH_TOLERANCE):
        bad.append(f"the prefill engine received {times(r['prefill_ratio'])} of the prompt "
                   "tokens sent")
    if not (r["output_tokens"] > 0 and r["completed"] == r["num_prompts"]):
        bad.append(f"{charts.fmt(r['completed'])} of {charts.fmt(r['num_prompts'])} requests "
                   f"completed, {charts.fmt(r['output_tokens'])} tokens written")
    return bad


def wins_and_losses(t: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Where the pair's latency beat the single engine's at the same load (ratio below
    1 − WIN_MARGIN), and where it lost (above 1 + WIN_MARGIN)."""
    wins, losses = [], []
    for _, r in t.iterrows():
        for col, name in (("ttft_ratio", "median TTFT"), ("median_itl_ratio", "median ITL"),
                          ("p99_itl_ratio", "P99 ITL")):
            v = r[col]
            if not math.isfinite(v):
                continue
            said = f"{name} {times(v)} at {_load(r)}"
            if v < 1 - WIN_MARGIN:
                wins.append(said)
            elif v > 1 + WIN_MARGIN:
                losses.append(said)
    return wins, losses


def rule(unit: Any, ev: Evidence) -> Any:
    """The verdict of ``unit`` (a PrefillDecodeSplit) on ``ev``; see its rule's docstring."""
    t = table(ev)
    if t.empty:
        return unit.verdict(ev, "no disaggregated run", NOT_MEASURED,
                            "needs an engine_grid entry {disaggregate: {...}} (a prefill "
                            "engine, a decode engine and a KV connector) beside {} (one "
                            "engine) at the same load points: params/ch06-h200.yaml on a GPU; "
                            "on the CPU params/ch06-disagg.yaml (experiment ch06-disagg) shows "
                            "the mechanism, its latency ratios need a GPU")
    failed = [(r, mechanism(r)) for _, r in t.iterrows()]
    failed = [(r, bad) for r, bad in failed if bad]
    per_prompt = t["bytes_per_prompt"].median()
    measured = (f"{len(t)} load point(s): per stored prompt {charts.fmt(per_prompt)} B crossed "
                f"({times(t['bytes_ratio'].median())} the block-aligned prompt × "
                f"{charts.fmt(t['kv_bytes_per_token'].median())} B/token); the decode engine "
                f"loaded {times(t['loaded_ratio'].median())} the expected prompt tokens")
    compared = t[t["ttft_ratio"].map(math.isfinite)]
    if len(compared):
        measured += (f"; vs one engine: median TTFT {_span(compared['ttft_ratio'])}, "
                     f"P99 ITL {_span(compared['p99_itl_ratio'])}")
    if failed:
        r, bad = failed[0]
        return unit.verdict(ev, measured, DIFFERS,
                            f"at {_load(r)}: " + "; ".join(bad)
                            + (f" (and {len(failed) - 1} more load point(s))"
                               if len(failed) > 1 else ""), float(t["bytes_ratio"].median()), 1.0)
    wins, losses = wins_and_losses(compared)
    why = ("the prefill engine computed every prompt, its KV crossed through "
           f"{t['kv_connector'].iloc[0]} (bytes = block-aligned prompt tokens × KV bytes per "
           f"token, within {MATCH_TOLERANCE:.0%}), the decode engine loaded it for every request "
           "and wrote the tokens")
    if len(compared):
        why += (f". Wins: {'; '.join(wins)}" if wins else ". No latency win") + (
            f". Losses: {'; '.join(losses)}" if losses else ". No latency loss")
        why += f" (beyond ±{WIN_MARGIN:.0%} of one engine at the same load)"
    else:
        why += ". No single engine ran at the same load points: no TTFT/ITL ratios"
    if not ev.on_gpu:
        why += (". On a CPU both engines share the cores, so the ratios say little about "
                "disaggregation")
    return unit.verdict(ev, measured, HOLDS, why, float(t["bytes_ratio"].median()), 1.0)


def _span(s: pd.Series) -> str:
    s = s[s.map(math.isfinite)]
    if s.empty:
        return "n/a"
    lo, hi = float(s.min()), float(s.max())
    return times(lo) if math.isclose(lo, hi, rel_tol=0.005) else f"{times(lo)}–{times(hi)}"


def _short_load(r: pd.Series, t: pd.DataFrame) -> str:
    """A load point's axis label: users, and the rate or lengths only where they vary."""
    rate = r["request_rate"]
    out = f"{int(r['users'])} users"
    if not (missing(rate) or math.isinf(rate)):
        out += f", {float(rate):g} req/s"
    if t["input_len"].nunique() > 1 or t["output_len"].nunique() > 1:
        out += f", {int(r['input_len'])}+{int(r['output_len'])} tok"
    return out


def chart(unit: Any, ev: Evidence) -> alt.TopLevelMixin:
    """Latency ratios (pair ÷ one engine) per load point first; KV bytes per request against
    prompt tokens below (points: measured; dashed: tokens × the model's KV bytes per token);
    the manual's panel beside."""
    t = table(ev)
    if t.empty:  # nothing measured: the manual's panel alone
        return unit.reference_panel()
    ratios = [charts.Ratio(_short_load(r, t), None, {
        "median TTFT": r["ttft_ratio"], "median ITL": r["median_itl_ratio"],
        "P99 ITL": r["p99_itl_ratio"]}) for _, r in t.iterrows()]
    lengths = sorted({f"{int(a)}+{int(b)}" for a, b in zip(t.input_len, t.output_len,
                                                           strict=True)})
    head = charts.ratio_bars(ratios, "Disaggregated ÷ one engine, same load (Fig 6.2)",
                             [f"prompt+output tokens {', '.join(lengths)}; below 1×: the pair "
                              "is faster, above: slower", "the manual states no number"])
    pts = t.assign(series=t["engine_label"].map(charts.display_label),
                   mb_per_prompt=t["bytes_per_prompt"] / 1e6)
    top = float(pts["prompt_tokens"].max()) * 1.1
    line = pd.DataFrame([{"prompt_tokens": n, "mb": n * float(b) / 1e6,
                          "per_token": f"{charts.fmt(b)} B/token"}
                         for b in pts["kv_bytes_per_token"].dropna().unique() for n in (0, top)])
    x = alt.X("prompt_tokens:Q", title="prompt tokens per request")
    measured = alt.Chart(pts).mark_point(filled=True, size=80).encode(
        x=x, y=alt.Y("mb_per_prompt:Q", title="KV MB that crossed per request"),
        color=alt.Color("series:N", title=None),
        tooltip=["engine_label", "users", "prompt_tokens", "bytes_per_prompt",
                 "expected_bytes_per_prompt", "kv_bytes_per_token", "block"])
    expected = alt.Chart(line).mark_line(strokeDash=[4, 3], color="#616161").encode(
        x=x, y="mb:Q", detail="per_token:N", tooltip=["per_token"])
    bytes_chart = alt.layer(expected, measured).properties(
        width=charts.WIDTH, height=charts.HEIGHT,
        title=charts.titled("KV bytes per request against prompt length",
                            ["points: what the prefill engine wrote per stored prompt; dashed: "
                             "prompt tokens × the model's KV bytes per token"]))
    return charts.ratio_first(head, bytes_chart, unit.reference_panel())
