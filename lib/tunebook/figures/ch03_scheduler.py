"""Chapter 3 — the scheduler's knobs: max_num_seqs, the prefix cache, block reuse, the
chunked-prefill budget (Figs 3.1–3.4)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook import charts
from tunebook.evidence import (
    DIFFERS,
    HOLDS,
    NOT_MEASURED,
    RATIO_TOLERANCE,
    Claim,
    Evidence,
    times,
    within,
)
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.manual import result, setting

CHAPTER = chapter(3, "The scheduler's knobs", None,
                  "max_num_seqs, prefix caching, block reuse and the chunked-prefill budget.")

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


@figure("3.2")
class PrefixCacheTtft(FigureUnit):
    title = "The prefix cache keeps the first token fast"
    refs = (
        result("ttft_ms_prefix_cache_on", 400, "ms",
               "time to first token at every shared prefix length, prefix cache on", "≈"),
    )
    needs = Needs(knobs=("enable_prefix_caching",))


@figure("3.3")
class BlockReuse(FigureUnit):
    title = "Block reuse stops at the first block that differs"
    needs = Needs(knobs=("block_size", "enable_prefix_caching"))


@figure("3.4")
class ChunkedPrefillBudget(FigureUnit):
    title = "The chunked-prefill budget and the P99 ITL"
    refs = (
        setting("request_rate_req_s", 0.5, "req/s", "offered load (--request-rate)"),
        setting("max_num_batched_tokens", 16384, "tokens", "the raised token budget per step"),
        result("p99_itl_ms_baseline", 574, "ms", "P99 ITL before (the claim names no budget)"),
        result("p99_itl_ms_budget_16384", 798, "ms", "P99 ITL with max_num_batched_tokens=16384"),
    )
    note = _NO_MACHINE
    needs = Needs(knobs=("max_num_batched_tokens",))
