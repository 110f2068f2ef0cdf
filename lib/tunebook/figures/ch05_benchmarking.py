"""Chapter 5 — benchmarking honestly: peak against knee, and a peer engine on the same
client (Figs 5.1–5.3)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook import charts, stats
from tunebook.evidence import DIFFERS, HOLDS, NOT_MEASURED, Claim, Evidence
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.manual import result, setting

CHAPTER = chapter(
    5, "Benchmarking honestly", "05_benchmarking",
    """A benchmark's headline number is a choice. This notebook runs one engine config through a
concurrency sweep past saturation and marks, on each curve, the throughput peak and the latency
knee: they are different points, and which one a report quotes changes what a reader concludes.
Figs 5.2 and 5.3 (SGLang beside vLLM on the same client) need a peer engine and a GPU.

`tunebook run params/ch05.yaml` runs it on the embedded CPU default; `params/ch05-h200.yaml` on a
GPU.""")


@figure("5.1")
class PeakIsNotKnee(FigureUnit):
    title = "The throughput peak is not the latency knee"
    refs = (
        result("output_tok_s_peak", 275, "tok/s", "peak output throughput (no cache reset)"),
        result("peak_users", 32, "users", "concurrent users at the throughput peak"),
    )
    note = ("The claim names no machine. Its peak output at 32 users is also Fig 3.1's default "
            "at 32 users.")
    narrative = ("A concurrency sweep run past saturation. The workbook finds, on each curve, "
                 "the throughput peak (the most output tok/s) and the latency knee (the last "
                 "load point where an added user still buys throughput at a bounded latency "
                 "cost; the rule is in `tunebook.stats.saturation`) and marks both. The "
                 "claim: the peak is not the knee — past the knee, users pay in latency for "
                 "little more throughput.")
    plot = charts.Curves(y=("output_tok_s", "median_tpot_ms"), saturation=True)

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per engine config: the peak and the knee found on its measured curve."""
        if not {"max_concurrency", "output_tok_s", "engine_label"} <= set(ev.ok.columns):
            return pd.DataFrame(columns=["engine_label", "peak_x", "knee_x"])
        return stats.saturation(ev.ok, x="max_concurrency", y="output_tok_s",
                                latency="median_tpot_ms", curve_by="engine_label")

    def rule(self, ev: Evidence) -> Claim:
        """On the default engine config's concurrency curve, holds when the knee (see
        stats.saturation) lies at fewer users than the throughput peak: the peak is not the
        knee. Not measured when the sweep did not reach past the knee."""
        t = self.table(ev)
        if t.empty or t["peak_x"].isna().all():
            return self.verdict(ev, "no concurrency curve", NOT_MEASURED,
                                "needs a concurrency sweep (load.users) of one engine config")
        default = t[t["engine_label"] == "default"]
        r = (default if len(default) else t).iloc[0]
        peak = f"peak {r.peak_y:,.0f} tok/s at {int(r.peak_x)} users"
        if r.knee_status != stats.KNEE_FOUND or pd.isna(r.knee_x):
            return self.verdict(ev, f"{peak}; knee: {r.knee_status}", NOT_MEASURED,
                                "the sweep did not reach saturation: add more users")
        text = (f"[{r.engine_label}] {peak}; knee at {int(r.knee_x)} users "
                f"({r.knee_y:,.0f} tok/s)")
        holds = r.knee_x < r.peak_x
        why = (f"the knee comes before the peak ({r.rule})" if holds else
               f"the peak is at the knee ({r.rule})")
        if bool(r.get("peak_at_edge")):
            why += ("; the peak is the largest load measured, so the curve's true peak may lie "
                    "further out — the knee before it holds either way")
        return self.verdict(ev, text, HOLDS if holds else DIFFERS, why,
                            float(r.peak_x), self.ref("peak_users").value)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        return charts.beside(charts.curves(ev.df, self.plot), self.reference_panel())


@figure("5.2")
class SameOutputAsSglang(FigureUnit):
    title = "vLLM and SGLang write the same output"
    refs = (
        result("output_diff_pct_vllm_vs_sglang_max", 3, "%",
               "vLLM and SGLang output differ by at most this", "≤"),
        setting("max_users", 32, "users", "up to this many concurrent users", "≤"),
    )
    note = "'the same output' most likely means output throughput; the claim does not say."
    needs = Needs(gpu=True, peer_engine="SGLang")


@figure("5.3")
class TokenGapVsSglang(FigureUnit):
    title = "The P99 token gap beside SGLang"
    refs = (
        result("p99_itl_ratio_vllm_vs_sglang_32_users", 2.0, "x",
               "P99 inter-token gap, vLLM ÷ SGLang", ">"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    needs = Needs(gpu=True, peer_engine="SGLang")
