"""What notebooks call: one object per notebook run, so cells stay one line of narrative each.

    wb = workbook.open(params_file, overrides, outputs)   # validates before anything starts
    wb.plan()          # the dry run, as text
    wb.run()           # the sweep (resumes; skips finished runs)
    wb.table()         # results as a DataFrame (latest attempt per run)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook import figures
from tunebook.core import config
from tunebook.figures.ch01_engine import startup_facts
from tunebook.inputs import params as P
from tunebook.measure.sweep import Sweep, SweepOptions, SweepResult
from tunebook.present import claims, index, report
from tunebook.results import machines
from tunebook.results.store import not_ok_rows, ok_rows

__all__ = ["Workbook", "open", "startup_facts"]

def percentile_notes(table: pd.DataFrame, rows: pd.DataFrame) -> pd.DataFrame:
    """`table` with a `percentiles` column where a percentile it shows rests on too few samples
    (tunebook.results.stats.MIN_SAMPLES): which, and on how many."""
    from tunebook.results import stats

    shown = [c for c in table.columns if stats.percentile_of(c)]
    notes = []
    for i in range(len(table)):
        row = rows.iloc[i].to_dict()
        thin = [(c, stats.samples_of(c, row)) for c in shown
                if stats.too_few(c, stats.samples_of(c, row))]
        notes.append("; ".join(f"{c.split('_', 1)[0].upper()} {c.split('_')[1].upper()} from "
                               f"{n:.0f} samples (needs {stats.MIN_SAMPLES[c.split('_', 1)[0]]})"
                               for c, n in thin))
    return table.assign(percentiles=notes) if any(notes) else table


@dataclass
class Workbook:
    params: P.SweepParams
    sweep: Sweep
    dry_run: bool = False
    result: SweepResult | None = None

    def plan(self) -> str:
        """The dry run. In a dry run (a replot) it first says what the figures are drawn
        from, since the plan then describes what would run on *this* machine."""
        if not self.dry_run:
            return self.sweep.describe()
        return f"{self.stored()}\nWere these params run on this machine:\n{self.sweep.describe()}"

    def stored(self) -> str:
        """One line: the stored runs the figures are drawn from, and where they were made."""
        df = self.table()
        if df.empty:
            return "dry run: nothing starts, and no runs are stored yet"
        ok = ok_rows(df)
        made = sorted({f"vLLM {v} on {h}" for v, h in zip(
            ok.get("vllm_version", []), ok.get("hardware", []), strict=False)
            if isinstance(v, str) and isinstance(h, str)})
        return (f"dry run: nothing starts; the figures are drawn from {len(df)} stored run(s), "
                f"{len(ok)} ok" + (f" ({'; '.join(made)})" if made else ""))

    def header(self) -> str:
        """One markdown line: what this notebook runs and where its results go (a path
        relative to the project, so a shared report shows no machine's layout)."""
        p = self.params
        if p.figures_only:
            return (f"**Experiment** `{p.experiment}` — model `{p.model}`, figures only: no "
                    f"engine starts. Results: `{config.display_path(self.sweep.store.root)}`")
        return (f"**Experiment** `{p.experiment}` — model `{p.model}`, "
                f"{len(p.engine_grid)} engine config(s) × {len(p.load.users)} load point(s) "
                f"× {p.repeats} repeat(s). Results: "
                f"`{config.display_path(self.sweep.store.root)}`")

    def run(self) -> SweepResult | None:
        """Run (or resume) the sweep. In a dry run, print the plan and start nothing."""
        if self.dry_run:
            print(self.stored())
            return None
        self.result = self.sweep.run()
        r = self.result
        print(f"{r.ok} run(s) ok, {r.failed} not ok, {r.skipped} already done "
              f"→ {config.display_path(self.sweep.store.root)}")
        return r

    def table(self) -> pd.DataFrame:
        return self.sweep.store.table()

    def changes(self) -> None:
        """In a dated measurement (`--again`): what changed since the previous one beyond
        noise in words (the verdict --again exits on: history.verdict_since) above tunebook
        diff's table of the two windows; else a line saying there is none."""
        from IPython.display import Markdown, display

        from tunebook.present import diff
        from tunebook.results import measurements

        root = self.sweep.store.root
        since = self.sweep.options.since or measurements.since_from_env()
        prev = measurements.previous(root, since) if since else None
        if prev is None:
            display(Markdown("This run is not a dated measurement (`--again`), or it is the "
                             "first one: nothing to compare with."))
            return
        try:
            table, figs = diff.run(diff.Side(root, since=prev.started, until=since),
                                   diff.Side(root, since=since))
        except diff.DiffError as e:
            display(Markdown(f"Nothing to compare: {e}"))
            return
        from tunebook.present import history

        v = history.verdict_since(root, prev.started, since, table)
        display(Markdown(f"Since the measurement of {prev.started}: "
                         f"**{history.verdict_words(v)}**.\n\n```\n"
                         + diff.text(table, figs, "the last measurement", "this one")
                         + "\n```"))

    def ok(self) -> pd.DataFrame:
        return ok_rows(self.table())

    def startup_facts(self) -> pd.DataFrame:
        """Fig 1.1: one row per engine config that started."""
        return startup_facts(self.table())

    def start_phases(self) -> pd.DataFrame:
        """One row per engine start: where its time went, phase by phase (start_phases)."""
        from tunebook.servers.start_phases import phases_frame

        root = self.sweep.store.root
        return phases_frame(list(self.sweep.store.records(requests=False)), root)

    def show_start_phases(self) -> None:
        """The start-up chart (stacked phases per engine start) and its table (seconds), or a
        line saying why not."""
        from IPython.display import Markdown, display

        from tunebook.charts import plots as charts
        from tunebook.servers.start_phases import PHASES

        frame = self.start_phases()
        c = charts.start_phases(frame)
        if c is None:
            display(Markdown("No engine start is stored for this experiment."))
            return
        display(c)
        cols = ["engine_label", *[f"start_{p}_s" for p in PHASES if f"start_{p}_s" in frame
                                  and frame[f"start_{p}_s"].notna().any()],
                "startup_s", "compile_cache"]
        display(frame[cols].rename(columns=lambda c: c.removeprefix("start_")).round(1))

    def failures(self) -> pd.DataFrame:
        """Every run that is not ok, with the line that explains it and what to change."""
        df = self.table()
        cols = ["engine_label", "max_concurrency", "status", "error", "error_line", "error_hint"]
        return not_ok_rows(df)[cols].reset_index(drop=True)

    # -- the manual's figures -------------------------------------------------------------------
    def evidence(self) -> claims.Evidence:
        return claims.load_evidence(self.sweep.store.root)

    def figure(self, fig: str, ev: claims.Evidence | None = None) -> None:
        """Display Fig ``fig``: the verdict line, then the measured chart beside the manual's
        claim — or only the verdict when the figure cannot run on this machine."""
        from IPython.display import Markdown, display

        ev = ev or self.evidence()
        claim = figures.verdict(ev, fig)
        display(Markdown(figures.verdict_markdown(claim)))
        c = figures.chart(ev, fig, claim)
        if c is not None:
            display(c)

    def figures(self) -> None:
        """Every figure the params target, each under its title and narrative."""
        from IPython.display import Markdown, display

        ev = self.evidence()
        for fig in self.params.figures:
            unit = figures.get(fig)
            display(Markdown(f"### Fig {fig} — {unit.title}\n{unit.narrative}"))
            self.figure(fig, ev)

    def claims(self) -> pd.DataFrame:
        """The claims table of this experiment (see tunebook.present.claims)."""
        return claims.evaluate([self.sweep.store.root])

    def show_claims(self) -> None:
        from IPython.display import HTML, display

        display(HTML(claims.to_html(self.claims(), title=f"Claims: {self.params.experiment}",
                                    fragment=True)))

    def summary(self) -> pd.DataFrame:
        """The headline numbers per engine config and load point (a replay: per speed, with
        its goodput)."""
        ok = self.ok()
        replay = "replay_speed" in ok and ok["replay_speed"].notna().any()
        load = ["replay_speed"] if replay else ["max_concurrency", "request_rate"]
        cols = ["engine_label", *load, "output_tok_s",
                *([] if replay else ["output_tok_s_per_user"]), "median_ttft_ms",
                "median_tpot_ms", "p99_itl_ms", "completed", "failed_requests",
                *(["request_goodput_req_s", "slo_attainment"] if replay else []),
                # what the tokens cost (params cost:, the user's price) and the GPUs' energy
                # over the measured window, where the run has them
                *[c for c in ("usd_per_m_output_tok", "energy_per_output_tok_j", "mean_power_w")
                  if c in ok and ok[c].notna().any()]]
        table = ok[[c for c in cols if c in ok]].reset_index(drop=True)
        return percentile_notes(table, ok.reset_index(drop=True))

    def cost(self) -> None:
        """What each config's tokens cost against its p99 TPOT (the Pareto view), or a line
        saying why not: no price (params cost:) and no GPU energy counter."""
        from IPython.display import Markdown, display

        from tunebook.charts import cost

        chart = cost.pareto(self.table())
        if chart is None:
            notes = self.table().get("energy_note", pd.Series(dtype=str)).dropna()
            why = f" ({notes.iloc[0]})" if len(notes) else ""
            display(Markdown("No cost to draw: no price was given (params `cost: "
                             "{usd_per_hour: ...}`) and no run has an energy number" + why))
            return
        display(chart)

    # -- a workload file (dataset: file) ------------------------------------------------------
    def workload(self) -> None:
        """What a workload file asked beside what vLLM's client sent (the run at the highest
        replay speed), then per run its goodput and the prefix cache the trace's ids predict
        beside the engine's hits; a line saying why not when the load is not a file."""
        from IPython.display import Markdown, display

        from tunebook.charts import plots as charts
        from tunebook.results import workload

        ok = self.ok()
        parts = [p for p in self.params.all_parts() if p.load.replay is not None]
        if not parts or "workload_file" not in ok or ok["workload_file"].isna().all():
            display(Markdown("This experiment's load is not a workload file."))
            return
        for part in parts:
            rows = ok[ok["part"].fillna("") == part.name] if part.name else ok
            rows = rows[rows["workload_file"].notna()]
            if rows.empty:
                display(Markdown(f"`{part.load.replay.file.name}`: no run of it is stored yet."))
                continue
            if part.name:
                display(Markdown(f"### {part.name}"))
            display(Markdown(workload.describe(rows)))
            top = rows.sort_values("replay_speed", na_position="first").iloc[-1]
            rec = self.sweep.store.record_of(top.to_dict())
            asked = workload.asked_for(top.to_dict(), part.load.replay)
            sent = workload.sent(rec) if rec else pd.DataFrame()
            if not asked.empty or not sent.empty:
                speed = top.get("replay_speed")
                at = f" at {speed:g}× its rate" if pd.notna(speed) else ""
                display(charts.workload_profile(
                    asked, sent, f"{top['workload_file']}{at}: asked and sent "
                                 f"({top['engine_label']})"))
            display(workload.runs_table(rows))

    def replay(self, y: str = "output_tok_s") -> None:
        """A metric against the replay speed, one curve per engine config, per workload file."""
        from IPython.display import Markdown, display

        from tunebook.charts import plots as charts

        ok = self.ok()
        if "replay_speed" not in ok or ok["replay_speed"].isna().all() or y not in ok:
            display(Markdown("No replay of a trace is stored yet."))
            return
        ok = ok[ok["replay_speed"].notna() & ok[y].notna()]
        for name, rows in ok.groupby("workload_file", sort=True):
            display(charts.scaling(rows, y=y, x="replay_speed",
                                   title=f"{charts.axis_title(y)}: {name}"))


def open(params_file: str | Path, overrides: dict[str, Any] | None = None,  # noqa: A001
         outputs: str | Path = "../outputs", dry_run: bool = False,
         progress: bool = True) -> Workbook:
    params = P.load(params_file, overrides or {})
    report.enable_offline_charts()
    sweep = Sweep(params, machines.experiments_root(outputs, settle=not dry_run), SweepOptions(
        progress=progress, on_finish=index.rebuild))
    return Workbook(params, sweep, dry_run=dry_run)


def search(params_file: str | Path, overrides: dict[str, Any] | None = None,
           outputs: str | Path = "../outputs", dry_run: bool = False,
           progress: bool = True) -> dict | None:
    """What notebooks/20_slo calls: the search (resuming every stored point), or in a dry run
    the newest stored summary, for replotting without an engine."""
    from tunebook.inputs import slo
    from tunebook.search import tune

    params = P.load(params_file, overrides or {})
    report.enable_offline_charts()
    if not params.section(slo.SLO) or not params.section(slo.SEARCH):
        raise ValueError(f"{params_file}: no slo/search section: nothing to search")
    root = machines.experiments_root(outputs, settle=not dry_run)
    print(tune.describe(params, root))
    if dry_run:
        out = tune.stored(root, params.experiment)
        print("dry run: nothing starts; " + ("the newest stored search:" if out else
                                            "no search is stored yet"))
        now = slo.parse_search(params.section(slo.SEARCH), *params.load.search_levels()).to_dict()
        if out and out.get("search") and out["search"] != now:  # the params changed since
            changed = {k: out["search"].get(k) for k in sorted(set(now) | set(out["search"]))
                       if out["search"].get(k) != now.get(k)}
            print(f"  (it ran with {changed}: the params have changed since)")
    else:
        _, out = tune.tune(params, root, progress)
    if out:
        print(tune.report_text(out))
    return out
