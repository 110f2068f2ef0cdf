"""Where each engine start's time went: its phases (tunebook.servers.start_phases) as stacked
bars, one bar per start."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.charts.base import WIDTH, display_label, titled

# --- engine starts ------------------------------------------------------------------------
PHASE_COLOURS = ("#9ecae9", "#4c78a8", "#bab0ac", "#54a24b", "#e45756", "#eeca3b", "#b279a2",
                 "#f58518", "#72b7b2")  # one per start_phases.PHASES, in start order
# each phase as the chart's legend names it (start_phases.PHASES are identifiers)
PHASE_WORDS = {"api_import": "vLLM import", "engine_core": "engine core start",
               "worker_init": "device setup", "weights": "weights", "compile": "compile",
               "profile_kv": "KV cache sizing", "cuda_graphs": "CUDA graphs",
               "warmup": "warm-up", "api_ready": "API server ready"}


def start_phases(frame: pd.DataFrame, title: str = "Where each engine start's time went"
                 ) -> alt.LayerChart | None:
    """Stacked bars, one per engine start (start_phases.phases_frame), phases in start order;
    the total (spawn → /health) and the compile cache's state at the end of each bar."""
    from tunebook.servers.start_phases import PHASES, long_form

    data = long_form(frame)
    if data.empty:
        return None
    shown = [PHASE_WORDS.get(p, p) for p in PHASES]
    data["phase"] = data["phase"].map(lambda p: PHASE_WORDS.get(p, p))
    starts = frame.reset_index(drop=True)
    names = [f"{i + 1}. {display_label(str(r['engine_label']))}"
             for i, r in starts.iterrows()]
    data["engine start"] = [names[i] for i in data["start"]]
    y = alt.Y("engine start:N", title=None, sort=names, axis=alt.Axis(labelLimit=320))
    bars = alt.Chart(data).mark_bar(stroke="white", strokeWidth=0.5).encode(
        y=y, x=alt.X("sum(seconds):Q", title="seconds from spawn to /health answering"),
        color=alt.Color("phase:N", sort=shown, title="phase",
                        scale=alt.Scale(domain=shown, range=list(PHASE_COLOURS)),
                        legend=alt.Legend(orient="bottom", columns=5)),
        order=alt.Order("order:Q"),
        tooltip=["engine start", "phase", alt.Tooltip("seconds:Q", format=".1f"),
                 alt.Tooltip("startup_s:Q", format=".1f", title="start total (s)"),
                 "compile_cache"])
    totals = pd.DataFrame({
        "engine start": names, "startup_s": starts["startup_s"].astype(float),
        "label": [f"{float(r['startup_s']):.0f} s" + (
            f" · compile cache {r['compile_cache']}" if isinstance(r.get("compile_cache"), str)
            else "") for _, r in starts.iterrows()]})
    text = alt.Chart(totals).mark_text(align="left", dx=4, fontSize=10).encode(
        y=y, x="startup_s:Q", text="label:N")
    together = starts.get("engines_started_together")
    note = ("engines started together: those starts were timed under contention"
            if together is not None and (pd.to_numeric(together, errors="coerce") > 1).any()
            else None)
    return alt.layer(bars, text).properties(
        width=WIDTH + 120, height=alt.Step(22),
        title=titled(title, ["phases cut at vLLM's own log lines (± 1 s); hover for seconds",
                             note or ""]))
