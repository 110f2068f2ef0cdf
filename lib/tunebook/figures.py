"""One call per manual figure: the measured chart beside the manual's claim, and the verdict.

    figures.chart(evidence, "2.1")     # -> alt.Chart (measured here, beside the manual)
    figures.verdict(evidence, "2.1")   # -> claims.Claim

Notebooks call these through ``Workbook.figure(fig)``; a figure that cannot run on this
machine shows the reason instead of a chart — never a made-up one.
"""

from __future__ import annotations

from collections.abc import Callable

import altair as alt
import pandas as pd

from tunebook import charts, claims
from tunebook.claims import Evidence


def _fig_1_3(ev: Evidence) -> alt.TopLevelMixin:
    return charts.beside(alt.vconcat(charts.scaling(ev.df, "output_tok_s"),
                                     charts.scaling(ev.df, "median_tpot_ms")), "1.3")


def _fig_2_6(ev: Evidence) -> alt.TopLevelMixin:
    at32 = ev.ok[ev.ok["max_concurrency"] == 32]
    rows = [{"row": "manual · FP8 weights", "output_tok_s": 284.7,
             "source": "manual (reference; clock locked)"},
            {"row": "manual · baseline weights", "output_tok_s": 208.8,
             "source": "manual (reference; clock locked)"}]
    for label, g in at32.groupby("engine_label", sort=False):
        rows.append({"row": label, "output_tok_s": float(g["output_tok_s"].mean()),
                     "source": f"measured · KV pool {int(g['kv_pool_tokens'].iloc[0]):,}"})
    return charts._ref_bars(pd.DataFrame(rows), "output_tok_s", "row", "source",
                            "output tok/s at 32 users", "FP8 weights at 32 users (Fig 2.6)",
                            ["same KV pool for every config (kv_cache_memory_bytes)",
                             charts.SOURCE], fmt=",.1f")


CHARTS: dict[str, Callable[[Evidence], alt.TopLevelMixin]] = {
    "1.1": lambda ev: charts.startup_table(ev.df),
    "1.2": lambda ev: charts.beside(charts.process_tree(claims.process_tree(ev)), "1.2"),
    "1.3": _fig_1_3,
    "2.1": lambda ev: charts.kv_bytes(claims.kv_bytes_table(ev)),
    "2.2": lambda ev: charts.users_fit(claims.users_fit(ev)),
    "2.3": lambda ev: charts.failed_starts(claims.failed_starts(ev)),
    "2.4": lambda ev: charts.memory_budget(claims.memory_budget(ev)),
    "2.5": lambda ev: charts.tokens_per_gib(claims.tokens_per_gib(ev)),
    "2.6": _fig_2_6,
}


def verdict(ev: Evidence, fig: str) -> claims.Claim:
    fn = claims.EVALUATORS.get(fig)
    if fn is None:
        raise KeyError(f"no evaluator for Fig {fig}; there are: {', '.join(claims.EVALUATORS)}")
    return fn(ev)


def chart(ev: Evidence, fig: str) -> alt.TopLevelMixin | None:
    """The figure's chart, or None when nothing here can stand for it (see the verdict)."""
    c = verdict(ev, fig)
    if c.verdict in (claims.CANNOT, claims.NOT_MEASURED) and fig not in ("1.1", "2.1"):
        return None
    return CHARTS[fig](ev)


def verdict_markdown(c: claims.Claim) -> str:
    icon = {claims.HOLDS: "✅", claims.DIFFERS: "⚠️", claims.CANNOT: "⛔",
            claims.NOT_MEASURED: "…"}.get(c.verdict, "")
    return (f"**Fig {c.figure} — {icon} {c.verdict}** on {c.hardware or 'this machine'}. "
            f"*Manual (reference):* {c.manual}. *Measured here:* {c.measured}. "
            f"*Why:* {c.why}.")
