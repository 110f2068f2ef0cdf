"""The profile of a workload file's runs: what was asked (the prepared requests, at the run's
replay speed) beside what was sent (vLLM's per-request arrays in each run's JSON), and the
prefix cache the trace's hash ids predict beside the engine's own hit counts.

Frames, one row per request (`asked`, `sent`) or per run (`prefix_hits`);
tunebook.charts.workload draws them (`workload_profile`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import pandas as pd

from tunebook.inputs.workloads import replay as R


def asked(records: Iterable[Mapping[str, Any]], speed: float | None = None) -> pd.DataFrame:
    """The prepared requests: arrival (s after the first, at `speed`), input and output tokens
    (NaN where a file gives text), and the tokens of leading blocks an earlier request sent."""
    records = list(records)
    rows = []
    for i, (rec, lead) in enumerate(zip(records, R.shared_blocks(records), strict=True)):
        ts = rec.get("timestamp")
        rows.append({
            "request": i,
            "arrival_s": None if ts is None else ts / (speed or 1.0),
            "input_len": rec.get("input_length"),
            "output_len": rec.get("output_length", rec.get("output_tokens")),
            "shared_blocks": lead,
        })
    return pd.DataFrame(rows)


def sent(record: Mapping[str, Any]) -> pd.DataFrame:
    """One run's requests as vLLM's client sent them: start (s after the first), prompt and
    output tokens the server counted, and whether it failed."""
    req = record.get("requests") or {}
    starts = req.get("start_times") or []
    t0 = min(starts) if starts else 0.0
    n = max(len(req.get("input_lens") or []), len(starts))

    def at(key: str, i: int) -> Any:
        values = req.get(key) or []
        return values[i] if i < len(values) else None

    return pd.DataFrame([{
        "request": i,
        "start_s": None if at("start_times", i) is None else at("start_times", i) - t0,
        "input_len": at("input_lens", i), "output_len": at("output_lens", i),
        "failed": bool(at("errors", i)),
    } for i in range(n)])


def prefix_hits(rows: pd.DataFrame) -> pd.DataFrame:
    """The rows of a trace's runs with `engine_hit_share`: the share of prompt tokens the
    engine's prefix cache served (prefix_cache_hit_tokens / prefix_cache_query_tokens), to set
    beside what the trace's ids predict for an unbounded cache (workload_shared_prefix_share).
    Empty when the rows lack either."""
    need = {"workload_shared_prefix_share", "prefix_cache_hit_tokens",
            "prefix_cache_query_tokens"}
    if rows.empty or not need <= set(rows.columns):
        return pd.DataFrame()
    df = rows[rows["workload_shared_prefix_share"].notna()]
    q = pd.to_numeric(df["prefix_cache_query_tokens"], errors="coerce")
    hit = pd.to_numeric(df["prefix_cache_hit_tokens"], errors="coerce")
    return df.assign(engine_hit_share=hit / q.where(q > 0)).reset_index(drop=True)


def asked_for(row: Mapping[str, Any], replay: R.Replay | None) -> pd.DataFrame:
    """The asked frame of a stored row, when its workload can be prepared again here (the same
    file, unchanged: the content hash matches); empty otherwise."""
    if replay is None:
        return pd.DataFrame()
    try:
        p = R.prepare(replay)
    except (OSError, ValueError):
        return pd.DataFrame()
    if p.sha != row.get("workload_sha"):
        return pd.DataFrame()
    return asked(p.records, row.get("replay_speed"))


GOODPUT_RULE = ("A request is good when it succeeded and met every bound (vLLM's --goodput: "
                "TPOT per request = (e2el − ttft) / (output tokens − 1), not every ITL gap). "
                "`request_goodput_req_s` is vLLM's: good requests per second of the run. "
                "`slo_attainment` is tunebook's: the share of the requests sent that were good "
                "(a failed request counts as not good).")


def describe(rows: pd.DataFrame) -> str:
    """Markdown: which file, how it was cut and scaled, how it was sent, the goodput rule."""
    r = rows.iloc[0]

    def has(col: str) -> bool:
        return col in r and pd.notna(r[col])

    what = [f"**{r['workload_file']}** ({r['workload_format']}, sent as vLLM's "
            f"`{r['workload_vllm_dataset']}`): {int(r['workload_requests']):,} requests"]
    if has("workload_duration_s"):
        what.append(f"over {r['workload_duration_s']:.0f} s of the trace's own clock")
    if has("workload_window_start_s"):
        what.append(f"(window {r['workload_window_start_s']:g}–{r['workload_window_end_s']:g} s)")
    if has("workload_first"):
        what.append(f"(the first {int(r['workload_first']):,})")
    scale = []
    if has("workload_length_scale") and r["workload_length_scale"] != 1:
        scale.append(f"lengths × {r['workload_length_scale']:g}")
    if has("workload_max_input_len"):
        scale.append(f"inputs capped at {int(r['workload_max_input_len']):,} tokens "
                     f"({int(r['workload_capped_inputs'] or 0):,} cut)")
    if has("workload_max_output_len"):
        scale.append(f"outputs at {int(r['workload_max_output_len']):,} "
                     f"({int(r['workload_capped_outputs'] or 0):,} cut)")
    lines = [" ".join(what) + (f"; {', '.join(scale)}" if scale else "") + "."]
    if has("workload_shared_prefix_share"):
        lines.append(f"Its hash ids put {r['workload_shared_prefix_share']:.0%} of the prompt "
                     "tokens in blocks an earlier request of the window sent (what an unbounded "
                     f"prefix cache would serve; blocks of {int(r['workload_block_tokens'])} "
                     "tokens as sent).")
    if has("workload_conversion"):
        lines.append(f"Converted: {r['workload_conversion']}.")
    if "goodput_slo" in rows and rows["goodput_slo"].notna().any():
        lines.append(f"Goodput bounds (ms): `{rows['goodput_slo'].dropna().iloc[0]}`. "
                     + GOODPUT_RULE)
    return "\n\n".join(lines)


def runs_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per run: the speed, what was served, the goodput, the prefix cache predicted and hit."""
    hits = prefix_hits(rows)
    df = hits if not hits.empty else rows
    cols = ["engine_label", "replay_speed", "completed", "failed_requests", "duration_s",
            "output_tok_s", "p99_ttft_ms", "p99_tpot_ms", "request_goodput_req_s",
            "slo_attainment", "workload_shared_prefix_share", "engine_hit_share"]
    out = df[[c for c in cols if c in df]].sort_values(
        [c for c in ("engine_label", "replay_speed") if c in df]).reset_index(drop=True)
    return out.rename(columns={  # short headers: the table fits a report's width
        "engine_label": "engine config", "replay_speed": "speed ×", "failed_requests": "failed",
        "request_goodput_req_s": "goodput req/s", "slo_attainment": "attainment",
        "workload_shared_prefix_share": "hits predicted", "engine_hit_share": "hits (engine)",
    }).round(3)
