"""Chapter 3 — the scheduler's knobs: max_num_seqs, the prefix cache, block reuse, the
chunked-prefill budget (Figs 3.1–3.4)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core.manual import result, setting
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.results import stats
from tunebook.results.evidence import (
    DIFFERS,
    HOLDS,
    NOISE,
    NOT_MEASURED,
    RATIO_TOLERANCE,
    Claim,
    Evidence,
    compare,
    missing,
    times,
    within,
)

CHAPTER = chapter(
    3, "The scheduler's knobs", "03_scheduler",
    """The manual's chapter 3 (figures 3.1–3.4): what capping running sequences does past the cap,
how the prefix cache keeps the first token fast as a shared prompt grows, how cached blocks are
reused only up to the first block that differs, and what a bigger token budget per step costs
the users who are decoding. One experiment with four load shapes (`parts:`); the default engine
config serves three of them and starts once. Every load point starts from an empty prefix cache
(`POST /reset_prefix_cache`), and each row keeps what the engine's own `/metrics` counted.

`tunebook run params/ch03.yaml` runs it on the embedded CPU default; `params/ch03-h200.yaml` on a
GPU.""")

_NO_MACHINE = "The claim names no machine."

# Below the cap the capped engine should serve like the default; 15% is the spread of single
# CPU runs seen here (repeats with confidence intervals will replace it).
MATCH_TOLERANCE = 0.15


@figure("3.1")
class CapMaxNumSeqs(FigureUnit):
    title = "Capping max_num_seqs"
    narrative = ("A cap on running sequences queues the users beyond it: up to the cap the "
                 "capped engine serves like the default, past it total output stops growing. "
                 "The chart leads with capped ÷ default output per load point beside the "
                 "manual's ratio, then the output curves.")
    refs = (
        setting("max_num_seqs_cap", 16, "sequences", "the cap (--max-num-seqs)"),
        result("matched_default_up_to_users", 16, "users",
               "the cap matched the default up to here", "≤"),
        result("output_tok_s_default_32_users", 275, "tok/s",
               "output tok/s, default max_num_seqs"),
        result("output_tok_s_cap16_32_users", 172, "tok/s", "output tok/s, max_num_seqs=16"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    note = _NO_MACHINE
    needs = Needs(knobs=("max_num_seqs",))
    plot = charts.Curves(y="output_tok_s")

    @property
    def manual_ratio(self) -> float:
        return (self.ref("output_tok_s_cap16_32_users").value
                / self.ref("output_tok_s_default_32_users").value)

    @property
    def past_cap(self) -> float:
        """Where the manual measured the ratio, as a multiple of the cap (32 users / 16)."""
        return self.ref("users").value / self.ref("max_num_seqs_cap").value

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per capped engine config and load point: mean output tok/s of the capped config
        and of the default (no max_num_seqs), and their ratio."""
        cols = ["engine_label", "cap", "users", "capped_tok_s", "default_tok_s", "ratio"]
        ok = ev.ok
        if ok.empty or "max_num_seqs" not in ok.columns:
            return pd.DataFrame(columns=cols)
        cap = pd.to_numeric(ok["max_num_seqs"], errors="coerce")
        means = ok.assign(cap=cap).groupby(["cap", "max_concurrency"], dropna=False)[
            "output_tok_s"].mean()
        default = {int(u): v for (c, u), v in means.items() if pd.isna(c)}
        rows = []
        for (c, u), v in means.items():
            if pd.isna(c) or int(u) not in default:
                continue
            label = ok[cap == c]["engine_label"].iloc[0]
            rows.append({"engine_label": label, "cap": int(c), "users": int(u),
                         "capped_tok_s": float(v), "default_tok_s": default[int(u)],
                         "ratio": float(v) / default[int(u)]})
        return pd.DataFrame(rows, columns=cols)

    def rule(self, ev: Evidence) -> Claim:
        """For each cap c (an engine config with max_num_seqs beside one without): at c users
        or fewer the capped output is within 15% of the default's (the cap does not bind), and
        at 2c users — the manual's 32 users for a cap of 16 — capped ÷ default output is
        within 25% of the manual's ratio (cap tok/s ÷ default tok/s)."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no capped config beside a default one", NOT_MEASURED,
                                "needs an engine config with max_num_seqs and one without, at "
                                "the same load points")
        ref = self.manual_ratio
        parts, holds, value = [], True, None
        for cap, g in t.groupby("cap"):
            below = g[g.users <= cap]
            past = g[g.users == round(cap * self.past_cap)]
            if past.empty:
                return self.verdict(ev, f"cap {cap}: users measured {sorted(g.users)}",
                                    NOT_MEASURED, f"the claim's ratio is at {self.past_cap:g}× "
                                                  f"the cap: measure {round(cap * self.past_cap)}"
                                                  " users")
            worst = float((below.ratio - 1).abs().max()) if len(below) else 0.0
            ratio = float(past.ratio.iloc[0])
            value = ratio if value is None else value
            ok_below = worst <= MATCH_TOLERANCE
            holds &= ok_below and within(ratio, ref)
            parts.append(f"cap {cap}: ≤{cap} users within {worst:.0%} of the default; at "
                         f"{int(past.users.iloc[0])} users {times(ratio)} "
                         f"({past.capped_tok_s.iloc[0]:,.0f} vs {past.default_tok_s.iloc[0]:,.0f}"
                         " tok/s)")
        why = (f"matched below the cap (within {MATCH_TOLERANCE:.0%}) and the ratio past it "
               f"within {RATIO_TOLERANCE:.2f}× of the manual's {times(ref)}" if holds else
               f"below the cap within {MATCH_TOLERANCE:.0%} and past it within "
               f"{RATIO_TOLERANCE:.2f}× of the manual's {times(ref)}: not both")
        return self.verdict(ev, "; ".join(parts), HOLDS if holds else DIFFERS, why, value, ref)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        t = self.table(ev)
        ratios = []
        for (u, cap), g in t.groupby(["users", "cap"]):
            manual = (1.0 if u <= cap else self.manual_ratio
                      if u == round(cap * self.past_cap) else None)
            ratios.append(charts.Ratio(f"{u} users (cap {cap})", manual,
                                       dict(zip(g.engine_label, g.ratio, strict=True)),
                                       "≈" if manual == 1.0 else "="))
        head = charts.ratio_bars(ratios, "Capped ÷ default output, measured vs the manual "
                                         "(Fig 3.1)",
                                 ["manual: ≈1× up to the cap, its ratio at 2× the cap"])
        return charts.ratio_first(head, charts.curves(ev.df, self.plot), self.reference_panel())


def _cache_on(ev: Evidence, rows: pd.DataFrame) -> pd.Series:
    """Whether each row's engine ran with the prefix cache (vLLM's default is on)."""
    col = rows.get("enable_prefix_caching", pd.Series(index=rows.index, dtype=object))
    return col.map(lambda v: True if missing(v) else str(v).lower() in ("true", "1"))


# Nearly flat: the longest shared prefix costs at most half again the shortest's TTFT.
FLAT_RATIO = 1.5


@figure("3.2")
class PrefixCacheTtft(FigureUnit):
    title = "The prefix cache keeps the first token fast"
    narrative = ("One user sends prompts that share a prefix of growing length (a short unique "
                 "suffix each), with the prefix cache on and off. The chart leads with each "
                 "config's TTFT at the longest shared length ÷ at the shortest beside the "
                 "manual's (≈1×: flat), then median TTFT against the shared length.")
    refs = (
        result("ttft_ms_prefix_cache_on", 400, "ms",
               "time to first token at every shared prefix length, prefix cache on", "≈"),
    )
    needs = Needs(knobs=("enable_prefix_caching",))
    plot = charts.Curves(y="median_ttft_ms", x="prefix_len")

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per engine config and shared prefix length: mean median-TTFT (ms), cache on/off."""
        cols = ["engine_label", "cache_on", "prefix_len", "median_ttft_ms"]
        ok = ev.ok
        if ok.empty or "prefix_len" not in ok or ok["prefix_len"].dropna().nunique() < 2:
            return pd.DataFrame(columns=cols)
        ok = ok.assign(cache_on=_cache_on(ev, ok))
        t = ok.groupby(["engine_label", "cache_on", "prefix_len"], as_index=False)[
            "median_ttft_ms"].mean()
        return t[cols]

    def growth(self, t: pd.DataFrame) -> pd.DataFrame:
        """TTFT at the longest shared prefix ÷ at the shortest, per engine config."""
        rows = []
        for (label, on), g in t.groupby(["engine_label", "cache_on"]):
            g = g.sort_values("prefix_len")
            rows.append({"engine_label": label, "cache_on": bool(on),
                         "lo": int(g.prefix_len.iloc[0]), "hi": int(g.prefix_len.iloc[-1]),
                         "ratio": float(g.median_ttft_ms.iloc[-1] / g.median_ttft_ms.iloc[0]),
                         "grew_ms": float(g.median_ttft_ms.iloc[-1] - g.median_ttft_ms.iloc[0])})
        return pd.DataFrame(rows, columns=["engine_label", "cache_on", "lo", "hi", "ratio",
                                           "grew_ms"])

    def rule(self, ev: Evidence) -> Claim:
        """With the cache on, median TTFT at the longest shared prefix is at most 1.5× that at
        the shortest (nearly flat); with it off, that ratio is at least 1.5× the cache-on ratio
        (TTFT grows with the shared part). Absolute TTFT is the machine's, not compared."""
        g = self.growth(self.table(ev))
        on, off = g[g.cache_on], g[~g.cache_on]
        if on.empty or off.empty:
            return self.verdict(ev, "needs the prefix cache on and off", NOT_MEASURED,
                                "needs an engine config with enable_prefix_caching false beside "
                                "one with it on, over at least two shared prefix lengths")
        r_on, r_off = float(on.ratio.iloc[0]), float(off.ratio.iloc[0])
        g_on, g_off = float(on.grew_ms.iloc[0]), float(off.grew_ms.iloc[0])
        text = (f"TTFT at {int(on.hi.iloc[0]):,} ÷ at {int(on.lo.iloc[0]):,} shared tokens: "
                f"cache on {times(r_on)} (+{g_on:,.0f} ms), cache off {times(r_off)} "
                f"(+{g_off:,.0f} ms)")
        holds = r_on <= FLAT_RATIO and r_off >= FLAT_RATIO * r_on
        removed = (f"; the cache removed {1 - g_on / g_off:.0%} of the growth" if g_off > 0
                   else "")
        why = (f"flat with the cache (≤ {FLAT_RATIO:g}×) and growing without it" if holds else
               f"without the cache TTFT grew only {times(r_off)}: prefilling the shared part "
               "costs too little here for the cache to show" if r_off <= FLAT_RATIO else
               f"with the cache TTFT still grew {times(r_on)} (flat means ≤ {FLAT_RATIO:g}×)"
               f"{removed}: what is left grows with the prompt outside the shared prefill "
               "(the suffix attends over the cached context; the server tokenizes the whole "
               "prompt), and shows where the base TTFT is small")
        return self.verdict(ev, text, HOLDS if holds else DIFFERS, why, r_on, 1.0)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        g = self.growth(self.table(ev))
        ratios = [charts.Ratio(f"TTFT, longest ÷ shortest shared prefix, cache "
                               f"{'on' if on else 'off'}", 1.0 if on else None,
                               dict(zip(grp.engine_label, grp.ratio, strict=True)), "≈")
                  for on, grp in g.groupby("cache_on")]
        head = charts.ratio_bars(ratios, "Prefix cache: TTFT growth, measured vs the manual "
                                         "(Fig 3.2)",
                                 ["manual: ≈1× with the cache on (TTFT flat at every length)"])
        return charts.ratio_first(head, charts.curves(ev.df, self.plot), self.reference_panel())


@figure("3.3")
class BlockReuse(FigureUnit):
    title = "Block reuse stops at the first block that differs"
    narrative = ("A base prompt, then prompts that share its first k tokens and differ after, "
                 "for k across several block boundaries; the engine reports how many prompt "
                 "tokens it served from cache. Reuse is whole blocks: a staircase in steps of "
                 "`block_size`.")
    needs = Needs(knobs=("block_size", "enable_prefix_caching"))

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per engine config and shared length k: cached tokens the engine reported, and the
        whole blocks before the first differing block (k // block_size × block_size)."""
        cols = ["engine_label", "block_size", "prefix_len", "cached_tokens", "whole_blocks"]
        ok = ev.ok
        if ok.empty or not {"cached_tokens", "prefix_len"} <= set(ok.columns):
            return pd.DataFrame(columns=cols)
        ok = ok[ok["cached_tokens"].notna()]
        # the engine's own block size (from /metrics), else the knob that set it
        bs = pd.Series(float("nan"), index=ok.index)
        for col in ("kv_block_size", "block_size"):
            if col in ok.columns:
                bs = bs.fillna(pd.to_numeric(ok[col], errors="coerce"))
        ok, bs = ok[bs.notna()], bs[bs.notna()].astype(int)
        t = ok.assign(block_size=bs)[["engine_label", "block_size", "prefix_len",
                                      "cached_tokens"]].copy()
        t["whole_blocks"] = (t.prefix_len // t.block_size) * t.block_size
        return t[cols].reset_index(drop=True)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when, for every block size and every shared length k, the cached tokens equal
        the whole blocks before the first differing one: k // block_size × block_size."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no block-reuse probe in this experiment", NOT_MEASURED,
                                "needs the block_reuse dataset (a base prompt, then prompts "
                                "sharing its first k tokens)")
        exact = (t.cached_tokens == t.whole_blocks)
        sizes = ", ".join(str(b) for b in sorted(t.block_size.unique()))
        ks = ", ".join(str(k) for k in sorted(t.prefix_len.unique()))
        text = (f"{int(exact.sum())} of {len(t)} probes cached exactly the whole blocks "
                f"(block sizes {sizes}; k = {ks})")
        bad = t[~exact]
        why = ("a staircase in steps of block_size at every k" if exact.all() else
               "; ".join(f"k={r.prefix_len}, block {r.block_size}: {r.cached_tokens} cached, "
                         f"{r.whole_blocks} expected" for r in bad.head(3).itertuples()))
        return self.verdict(ev, text, HOLDS if exact.all() else DIFFERS, why,
                            float(exact.mean()), 1.0)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        t = self.table(ev)
        t = t.assign(series="block " + t.block_size.astype(str))
        x = alt.X("prefix_len:Q", title="tokens shared with the cached prompt (k)")
        y = alt.Y("tokens:Q", title="prompt tokens served from cache")
        measured = alt.Chart(t).mark_point(filled=True, size=60).encode(
            x=x, y=alt.Y("cached_tokens:Q", title="prompt tokens served from cache"),
            color=alt.Color("series:N", title=None),
            tooltip=["engine_label", "block_size", "prefix_len", "cached_tokens",
                     "whole_blocks"])
        stairs = alt.Chart(t.rename(columns={"whole_blocks": "tokens"})).mark_line(
            interpolate="step-after", strokeDash=[4, 3], color="#616161").encode(
            x=x, y=y, detail="series:N")
        return charts.beside(alt.layer(stairs, measured).properties(
            width=charts.WIDTH, height=charts.HEIGHT,
            title=charts.titled("Cached tokens against tokens shared (Fig 3.3)",
                                ["points: what the engine served from cache; dashed: whole "
                                 "blocks before the first differing block"])),
            self.reference_panel())


def _itl_tail(ev: Evidence, budget: int, rate: float) -> tuple[float, float] | None:
    """(P99.9, max) of every inter-token gap, ms, of the ok runs of one token budget at one
    rate, from the per-request arrays vLLM's client returned (kept in each run's JSON)."""
    gaps: list[float] = []
    for rec in ev.records:
        row = rec.get("row", {})
        if (row.get("status") == "ok" and row.get("max_num_batched_tokens") == budget
                and row.get("request_rate") == rate):
            gaps += [g * 1000 for itl in ev.requests(rec).get("itls") or [] for g in itl or []]
    if not gaps:
        return None
    gaps.sort()
    return gaps[min(len(gaps) - 1, int(0.999 * len(gaps)))], gaps[-1]


@figure("3.4")
class ChunkedPrefillBudget(FigureUnit):
    title = "The chunked-prefill budget and the P99 ITL"
    narrative = ("Long prompts arrive at a steady request rate while others decode. A bigger "
                 "token budget per step (`max_num_batched_tokens`) lets one step take a bigger "
                 "chunk of a new prompt, and the decoding users wait longer between tokens: "
                 "P99 inter-token latency, bigger budget ÷ smaller, beside the manual's.")
    refs = (
        setting("request_rate_req_s", 0.5, "req/s", "offered load (--request-rate)"),
        setting("max_num_batched_tokens", 16384, "tokens", "the raised token budget per step"),
        result("p99_itl_ms_baseline", 574, "ms", "P99 ITL before (the claim names no budget)"),
        result("p99_itl_ms_budget_16384", 798, "ms", "P99 ITL with max_num_batched_tokens=16384"),
    )
    note = _NO_MACHINE
    needs = Needs(knobs=("max_num_batched_tokens",))
    plot = charts.Curves(y="p99_itl_ms", x="request_rate")

    @property
    def manual_ratio(self) -> float:
        return (self.ref("p99_itl_ms_budget_16384").value
                / self.ref("p99_itl_ms_baseline").value)

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per request rate: P99 ITL of the smallest and of the largest token budget, and
        their ratio (mean over repeats)."""
        cols = ["request_rate", "small_budget", "large_budget", "p99_itl_small_ms",
                "p99_itl_large_ms", "ratio"]
        ok = ev.ok
        if ok.empty or not {"max_num_batched_tokens", "request_rate", "p99_itl_ms"} <= set(
                ok.columns):
            return pd.DataFrame(columns=cols)
        ok = ok.assign(budget=pd.to_numeric(ok["max_num_batched_tokens"], errors="coerce"))
        ok = ok[ok.budget.notna() & ok.request_rate.notna()]
        rows = []
        for rate, g in ok.groupby("request_rate"):
            m = g.groupby("budget")["p99_itl_ms"].mean()
            if len(m) < 2:
                continue
            rows.append({"request_rate": float(rate), "small_budget": int(m.index.min()),
                         "large_budget": int(m.index.max()), "p99_itl_small_ms": float(m.iloc[0]),
                         "p99_itl_large_ms": float(m.iloc[-1]),
                         "ratio": float(m.iloc[-1] / m.iloc[0])})
        return pd.DataFrame(rows, columns=cols)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when the largest token budget gives a higher P99 ITL than the smallest at the
        manual's request rate (or, if not measured there, at every rate measured); with
        repeats, a difference inside the 95% intervals is 'within noise'. The ratio is shown
        beside the manual's (16,384-token budget ÷ the baseline)."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "needs two max_num_batched_tokens at a request rate",
                                NOT_MEASURED, "set max_num_batched_tokens in engine_grid and "
                                              "load.request_rates")
        want = self.ref("request_rate_req_s").value
        at = t[t.request_rate == want]
        use = at if len(at) else t
        decisions = []
        for r in use.itertuples():
            where = {"request_rate": r.request_rate}
            large = stats.interval(ev.df, "p99_itl_ms",
                                   {**where, "max_num_batched_tokens": r.large_budget})
            small = stats.interval(ev.df, "p99_itl_ms",
                                   {**where, "max_num_batched_tokens": r.small_budget})
            decisions.append(compare(large, small, ">", (f"{r.large_budget:,} tokens",
                                                         f"{r.small_budget:,} tokens"), "ms"))
        verdicts = {d.verdict for d in decisions}
        verdict = (DIFFERS if DIFFERS in verdicts else NOISE if NOISE in verdicts
                   else NOT_MEASURED if NOT_MEASURED in verdicts else HOLDS)
        text = "; ".join(f"{r.request_rate:g} req/s: P99 ITL {r.p99_itl_small_ms:,.0f} ms at "
                         f"{r.small_budget:,} → {r.p99_itl_large_ms:,.0f} ms at "
                         f"{r.large_budget:,} tokens ({times(r.ratio)})" for r in use.itertuples())
        why = "; ".join(d.why for d in decisions) + f" (manual: {times(self.manual_ratio)})"
        if not len(at):
            why += f"; not measured at the manual's {want:g} req/s"
        r = use.iloc[0]
        small, large = (_itl_tail(ev, b, r.request_rate) for b in (r.small_budget,
                                                                   r.large_budget))
        if small and large:
            why += (f". Beyond P99 (every gap of every request, from the stored arrays): "
                    f"P99.9 {small[0]:,.0f} → {large[0]:,.0f} ms, max {small[1]:,.0f} → "
                    f"{large[1]:,.0f} ms")
            if r.ratio <= 1 < large[1] / small[1]:
                why += (": the bigger budget makes fewer, longer stalls (a whole prompt in one "
                        "step), too few to reach the 1% tail that P99 reads")
        return self.verdict(ev, text, verdict, why, float(use.ratio.iloc[0]), self.manual_ratio)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        t = self.table(ev)
        want = self.ref("request_rate_req_s").value
        ratios = [charts.Ratio(f"P99 ITL, {r.large_budget:,} ÷ {r.small_budget:,} tokens, "
                               f"{r.request_rate:g} req/s",
                               self.manual_ratio if r.request_rate == want else None,
                               {"": r.ratio}) for r in t.itertuples()]
        head = charts.ratio_bars(ratios, "Token budget: P99 ITL ratio, measured vs the manual "
                                         "(Fig 3.4)", ["bigger budget ÷ smaller budget"])
        return charts.ratio_first(head, charts.curves(ev.df, self.plot), self.reference_panel())
