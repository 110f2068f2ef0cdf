"""Chapter 5 — benchmarking honestly: peak against knee, and a peer engine on the same
client (Figs 5.1–5.3)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core.manual import result, setting
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.results import stats
from tunebook.results.evidence import CANNOT, DIFFERS, HOLDS, NOT_MEASURED, Claim, Evidence
from tunebook.servers import sglang as peer

CHAPTER = chapter(
    5, "Benchmarking honestly", "05_benchmarking",
    """A benchmark's headline number is a choice. This notebook runs one engine config through a
concurrency sweep past saturation and marks, on each curve, the throughput peak and the latency
knee: they are different points, and which one a report quotes changes what a reader concludes.
Figs 5.2 and 5.3 put SGLang beside vLLM on the same client (`engine_kind: sglang`,
tunebook.servers.sglang); SGLang has no CPU build, so on a CPU they say so.

`tunebook run params/ch05.yaml` runs it on the embedded CPU default; `params/ch05-h200.yaml` on a
GPU, `params/ch05-peer-h200.yaml` vLLM and SGLang there.""")


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
                 "cost; the rule is in `tunebook.results.stats.saturation`) and marks both. The "
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


def peer_table(ev: Evidence) -> pd.DataFrame:
    """vLLM beside SGLang at each load both were measured at (same model, same client): per
    users, each engine's output tok/s and P99 inter-token gap, and vLLM ÷ SGLang of each.
    The engine is the `engine_kind` column (absent or 'vllm': vLLM)."""
    cols = ["users", "vllm_output_tok_s", "sglang_output_tok_s", "output_ratio",
            "output_diff_pct", "vllm_p99_itl_ms", "sglang_p99_itl_ms", "p99_itl_ratio"]
    ok = ev.ok
    if ok.empty or "engine_kind" not in ok.columns or "max_concurrency" not in ok.columns:
        return pd.DataFrame(columns=cols)
    kind = ok["engine_kind"].astype("string").fillna(peer.VLLM)
    per = {k: ok[kind == k].groupby("max_concurrency")[["output_tok_s", "p99_itl_ms"]].median()
           for k in (peer.VLLM, peer.SGLANG)}
    both = per[peer.VLLM].merge(per[peer.SGLANG], left_index=True, right_index=True,
                                suffixes=("_v", "_s"))
    if both.empty:
        return pd.DataFrame(columns=cols)
    t = pd.DataFrame({
        "users": both.index.astype(int),
        "vllm_output_tok_s": both["output_tok_s_v"].to_numpy(),
        "sglang_output_tok_s": both["output_tok_s_s"].to_numpy(),
        "vllm_p99_itl_ms": both["p99_itl_ms_v"].to_numpy(),
        "sglang_p99_itl_ms": both["p99_itl_ms_s"].to_numpy()})
    t["output_ratio"] = t["vllm_output_tok_s"] / t["sglang_output_tok_s"]
    t["output_diff_pct"] = (t["output_ratio"] - 1).abs() * 100
    t["p99_itl_ratio"] = t["vllm_p99_itl_ms"] / t["sglang_p99_itl_ms"]
    return t[cols].sort_values("users").reset_index(drop=True)


def _one_run_per_load(ev: Evidence) -> bool:
    ok = ev.ok
    if ok.empty or "engine_config_id" not in ok.columns or "max_concurrency" not in ok.columns:
        return True
    return bool(ok.groupby(["engine_config_id", "max_concurrency"]).size().max() <= 1)


def _no_peer(unit: FigureUnit, ev: Evidence) -> Claim:
    """The verdict when no load has rows of both engines."""
    if not ev.on_gpu:
        return unit.verdict(ev, "not run", CANNOT,
                            "SGLang has no CPU build: the peer runs on a GPU machine "
                            "(params/ch05-peer-h200.yaml, scripts/sglang_bundle.sh)")
    return unit.verdict(ev, "no load with both engines", NOT_MEASURED,
                        "needs rows of vLLM and of SGLang (engine_kind: sglang) at the same "
                        "users")


def _peer_chart(unit: FigureUnit, ev: Evidence, column: str, manual: float, qualifier: str,
                title: str, subtitle: str, band: tuple[float, float] | None = None
                ) -> alt.TopLevelMixin:
    """Ratio first: vLLM ÷ SGLang per load beside the manual's ratio (at its 32 users); each
    engine's own curve below."""
    t = peer_table(ev)
    ratios = [charts.Ratio(f"{int(r.users)} users", manual if r.users == 32 else None,
                           {"": float(getattr(r, column))}, qualifier) for r in t.itertuples()]
    if not ratios:
        ratios = [charts.Ratio("32 users", manual, {"": float("nan")}, qualifier)]
    head = charts.ratio_bars(ratios, title, [subtitle], band=band)
    return charts.ratio_first(head, charts.curves(_engine_named(ev.df), unit.plot),
                              unit.reference_panel())


def _engine_named(df: pd.DataFrame) -> pd.DataFrame:
    """Curves named by engine and version ('vLLM 0.26.0', 'SGLang 0.5.17') instead of the
    config labels ('default', 'engine_kind=sglang')."""
    if df.empty or "engine_kind" not in df.columns:
        return df
    kind = df["engine_kind"].astype("string").fillna(peer.VLLM)

    def version(col: str) -> pd.Series:
        return (df[col].astype("string").fillna("") if col in df.columns
                else pd.Series("", index=df.index, dtype="string"))

    named = kind.map({peer.VLLM: "vLLM", peer.SGLANG: "SGLang"}).fillna(kind)
    ver = version("vllm_version").where(kind == peer.VLLM, version("sglang_version"))
    return df.assign(engine_label=(named + " " + ver).str.strip())


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
    narrative = ("The same random-weight model (one config.json, one tokenizer: both engines "
                 "read the same folder) served by vLLM and by SGLang, loaded by vLLM's own "
                 "benchmark client through the same OpenAI completions endpoint, users 1 → 64. "
                 "Output tok/s of each engine per load, and how far apart they are.")
    plot = charts.Curves(y="output_tok_s")

    def table(self, ev: Evidence) -> pd.DataFrame:
        return peer_table(ev)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        bound = self.ref("output_diff_pct_vllm_vs_sglang_max").value / 100
        return _peer_chart(self, ev, "output_ratio", 1.0, "≈",
                           "vLLM ÷ SGLang output tok/s per load (Fig 5.2)",
                           "manual: within 3% (≈1×) up to 32 users", band=(1 - bound, 1 + bound))

    def rule(self, ev: Evidence) -> Claim:
        """Holds when, at every load up to the manual's 32 users measured on both engines,
        vLLM's output tok/s is within 3% of SGLang's (|vLLM ÷ SGLang − 1| ≤ 0.03); differs
        otherwise, naming the load with the largest gap."""
        t = self.table(ev)
        cap = self.ref("max_users").value
        t = t[t["users"] <= cap]
        if t.empty:
            return _no_peer(self, ev)
        worst = t.loc[t["output_diff_pct"].idxmax()]
        bound = self.ref("output_diff_pct_vllm_vs_sglang_max").value
        text = (f"largest gap {worst.output_diff_pct:.1f}% at {int(worst.users)} users "
                f"(vLLM {worst.vllm_output_tok_s:,.0f} vs SGLang "
                f"{worst.sglang_output_tok_s:,.0f} tok/s), over {len(t)} loads ≤ {cap:g} users")
        holds = worst.output_diff_pct <= bound
        why = (f"every load within {bound:g}%" if holds
               else f"{worst.output_diff_pct:.1f}% > {bound:g}%")
        if _one_run_per_load(ev):  # a 3% bound is near one run's noise: say it was not measured
            why += ("; one run per engine and load, so the run-to-run noise is not measured "
                    "(`repeats: 3` in the params would put intervals on each gap)")
        return self.verdict(ev, text, HOLDS if holds else DIFFERS, why,
                            float(worst.output_diff_pct), bound)


@figure("5.3")
class TokenGapVsSglang(FigureUnit):
    title = "The P99 token gap beside SGLang"
    refs = (
        result("p99_itl_ratio_vllm_vs_sglang_32_users", 2.0, "x",
               "P99 inter-token gap, vLLM ÷ SGLang", ">"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    needs = Needs(gpu=True, peer_engine="SGLang")
    narrative = ("The same two engines as Fig 5.2: the 99th percentile gap between two tokens "
                 "of one stream (P99 ITL), per load. The manual's claim is at 32 users.")
    plot = charts.Curves(y="p99_itl_ms")

    def table(self, ev: Evidence) -> pd.DataFrame:
        return peer_table(ev)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        return _peer_chart(self, ev, "p99_itl_ratio", 2.0, ">",
                           "vLLM ÷ SGLang P99 inter-token gap per load (Fig 5.3)",
                           "manual: more than 2× at 32 users")

    def rule(self, ev: Evidence) -> Claim:
        """At the manual's 32 users (else the measured load nearest to it, said so): holds
        when vLLM's P99 inter-token gap is more than twice SGLang's (vLLM ÷ SGLang > 2);
        differs otherwise."""
        t = self.table(ev)
        if t.empty:
            return _no_peer(self, ev)
        want = self.ref("users").value
        r = t.loc[(t["users"] - want).abs().idxmin()]
        at = f"{int(r.users)} users" + ("" if r.users == want else f" (nearest to {want:g})")
        ratio = float(r.p99_itl_ratio)
        ref = self.ref("p99_itl_ratio_vllm_vs_sglang_32_users").value
        text = (f"P99 ITL vLLM {r.vllm_p99_itl_ms:.1f} ms vs SGLang {r.sglang_p99_itl_ms:.1f} ms"
                f" at {at}: {ratio:.2f}×")
        return self.verdict(ev, text, HOLDS if ratio > ref else DIFFERS,
                            f"{ratio:.2f}× {'>' if ratio > ref else '≤'} {ref:g}×", ratio, ref)
