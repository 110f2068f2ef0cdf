"""Chapter 7 — troubleshooting: from a symptom to the page that fixes it (Fig 7.1).

Fig 7.1's table is generated: one row per diagnosis rule of ``tunebook.results.diagnose`` (symptom →
the one number or log line to check → the setting and the manual's page), each citing a run of
this machine's outputs root (outputs/<machine>/, every experiment stored there) where the
symptom occurred. What no stored run showed, chapter 7's params induce (parts named by each
rule's ``induce``): a KV pool too small for its load, a run timeout shorter than its load.
"""

from __future__ import annotations

import html
from pathlib import Path

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.results import diagnose
from tunebook.results.evidence import DIFFERS, HOLDS, NOT_MEASURED, Claim, Evidence, load_evidence
from tunebook.results.store import find_experiments

CHAPTER = chapter(
    7, "Troubleshooting", "07_troubleshooting",
    """Start from the symptom, check one number or one log line, then go to the page that fixes it.
The table below is not typed by hand: each row is a diagnosis rule (`tunebook.results.diagnose`, one
decorated function per symptom, its threshold in its docstring) run over **every experiment stored
for this machine** (the folder this experiment sits in, `outputs/<machine>/`): the rows of each run,
the engine's own `/metrics` counters the rows keep, and the engine logs. Each row cites the run
where the symptom showed (the strongest one that happened on its own, else one induced here), quotes
the number or the line, and names the setting and the manual's figure that explains the fix.

The runs of chapters 1–5 never preempted and never hung, so this experiment induces both on the
engine config of chapter 8: 16 users whose answers outgrow an 8 MiB KV pool (`induce_preemption`),
and a run timeout far shorter than its load (`induce_hang`, recorded as a failed run). A symptom
still unseen says which part of chapter 7's params induces it.

`tunebook run params/ch07.yaml` runs it on the embedded CPU default (`--outputs outputs/cpu` to
diagnose the committed CPU runs); `params/ch07-h200.yaml` on a GPU.""",
    extras=((
        "## The table, with its citations\nOne row per rule. *Seen here* links the report of "
        "the experiment that showed the symptom (links are relative to this experiment's "
        "`report.html`) and quotes what showed it; *fix* adds what that run's own numbers "
        "suggest; *page* links this machine's report of the figure that explains it.",
        "from tunebook.figures.ch07_troubleshooting import show_table\n"
        "show_table(wb.evidence())"),))

_CACHE: dict[tuple, tuple[diagnose.Stored, dict[str, list[diagnose.Finding]]]] = {}


def _fingerprint(root: Path) -> tuple:
    """What changes when a run is stored under ``root`` (its experiments' runs/ folders)."""
    out = []
    for p in find_experiments(root, max_depth=1):
        try:
            out.append((p.name, (p / "runs").stat().st_mtime_ns))
        except OSError:
            out.append((p.name, 0))
    return (str(root.resolve()), tuple(out))


def machine_findings(ev: Evidence) -> tuple[diagnose.Stored, dict[str, list[diagnose.Finding]]]:
    """Every experiment of this experiment's machine and every rule's findings there (read
    once per state of the folder: the verdict, the chart and the table share them)."""
    key = (_fingerprint(ev.machine_root), tuple(diagnose.RULES))
    if key not in _CACHE:
        stored = diagnose.Stored.load(ev.machine_root)
        _CACHE.clear()
        _CACHE[key] = (stored, diagnose.findings(stored))
    return _CACHE[key]


def _report_link(stored: diagnose.Stored, experiment: str | None) -> str | None:
    """The experiment's report, relative to this experiment's report.html (a sibling)."""
    if not experiment:
        return None
    return f"../{experiment}/report.html"


def _page_experiment(stored: diagnose.Stored, fig: str) -> str | None:
    """The experiment of this machine whose params draw Fig ``fig`` (the first by name)."""
    return next((ev.experiment for ev in stored.experiments if fig in ev.figures), None)


@figure("7.1")
class SymptomToFix(FigureUnit):
    title = "From the symptom to the fix"
    narrative = ("Each symptom with the one number or log line to check and the setting that "
                 "fixes it, generated from what this machine's experiments stored: a row is a "
                 "rule of `tunebook.results.diagnose`, and it cites the run "
                 "where the symptom occurred. "
                 "The grid shows, per symptom, how many runs of each experiment showed it "
                 "(induced ones outlined); the bars put the number each rule checks beside its "
                 "threshold.")
    needs = Needs()
    chart_when_unmeasured = True

    def table(self, ev: Evidence) -> pd.DataFrame:
        """diagnose.table over this machine's outputs root, with the cited experiment's
        report link and the experiment that draws each rule's page."""
        stored, found = machine_findings(ev)
        t = diagnose.table(stored, found)
        t["link"] = [_report_link(stored, e) for e in t["experiment"]]
        t["page_experiment"] = [_page_experiment(stored, p) for p in t["page"]]
        return t

    def rule(self, ev: Evidence) -> Claim:
        """Holds when every symptom row cites a run stored for this machine (its outputs
        root) and has a check and a fix; differs when a symptom was seen nowhere (the row
        says which part of chapter 7's params induces it). The measured value is the share
        of rows with a citation."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no diagnosis rule is registered", NOT_MEASURED,
                                "tunebook.results.diagnose has no rules")
        stored, _ = machine_findings(ev)
        if not stored.experiments:
            return self.verdict(ev, "no experiment stored here", NOT_MEASURED,
                                "run chapters 1–5 and this chapter's params first")
        complete = t["check"].astype(bool) & t["fix"].astype(bool)
        cited = t[(t["seen"] > 0) & complete]
        unseen = t[~t.index.isin(cited.index)]
        induced = cited[cited["induced"]]
        text = (f"{len(cited)} of {len(t)} symptoms cited from runs of "
                f"{len(stored.experiments)} experiments stored for this machine")
        if len(induced):
            text += "; induced by chapter 7: " + ", ".join(
                f"{r.symptom} ({r.experiment}, part {r.induce})" for r in induced.itertuples())
        if unseen.empty:
            return self.verdict(ev, text, HOLDS, "every symptom has a cited run, the number or "
                                "line to check and the fix", len(cited) / len(t), 1.0)
        why = "not seen yet: " + "; ".join(
            f"{r.symptom}" + (f" (induce it with the part {r.induce} of chapter 7's params)"
                              if r.induce else "") for r in unseen.itertuples())
        return self.verdict(ev, text, DIFFERS, why, len(cited) / len(t), 1.0)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        stored, found = machine_findings(ev)
        symptoms = [diagnose.get(n).symptom for n in diagnose.RULES]
        exps = [e.experiment for e in stored.experiments]
        cells = []
        for name, fs in found.items():
            for exp in exps:
                mine = [f for f in fs if f.experiment == exp]
                if mine:
                    cells.append({"symptom": diagnose.get(name).symptom, "experiment": exp,
                                  "runs": len(mine), "induced": any(f.induced for f in mine),
                                  "evidence": mine[0].evidence[:200], "run_id": mine[0].run_id})
        grid_df = pd.DataFrame(cells, columns=["symptom", "experiment", "runs", "induced",
                                               "evidence", "run_id"])
        y = alt.Y("symptom:N", sort=symptoms, title=None, axis=alt.Axis(labelLimit=320))
        # slanted: names longer than a column (ch05-peer-faults beside ch05-peer) collided
        # level; at -35° two neighbours stand 56 px × sin 35° ≈ 32 px apart, past a line's height
        x = alt.X("experiment:N", sort=exps, title=f"experiments stored in "
                  f"{stored.root.name or 'outputs'}/",
                  axis=alt.Axis(labelAngle=-35, labelAlign="right", labelLimit=200))
        base = alt.Chart(grid_df).encode(x=x, y=y, tooltip=["symptom", "experiment", "runs",
                                                            "induced", "run_id", "evidence"])
        rect = base.mark_rect(stroke="#212121").encode(
            color=alt.Color("runs:Q", title="runs showing it",
                            scale=alt.Scale(scheme="reds", type="log")),
            strokeWidth=alt.condition("datum.induced", alt.value(2.5), alt.value(0)))
        text = base.mark_text(fontSize=11).encode(text="runs:Q")
        # every symptom keeps its row, seen or not
        frame = alt.Chart(pd.DataFrame({"symptom": symptoms})).mark_tick(opacity=0).encode(y=y)
        grid = alt.layer(frame, rect, text).properties(
            width=max(charts.WIDTH, 56 * len(exps)), height=alt.Step(26),
            title=charts.titled("Where each symptom occurred (Fig 7.1)",
                                ["runs per symptom and experiment; outlined: induced by "
                                 "chapter 7's params; an empty row: not seen yet"]))
        best = [{"symptom": diagnose.get(n).symptom, "score": fs[0].score,
                 "experiment": fs[0].experiment, "evidence": fs[0].evidence[:200],
                 "induced": fs[0].induced}
                for n, fs in found.items() if fs and fs[0].score is not None]
        bars_df = pd.DataFrame(best, columns=["symptom", "score", "experiment", "evidence",
                                              "induced"])
        # a lollipop from the threshold (1) to the case: a log axis has no zero to start bars
        bars_df["threshold"] = 1.0
        lolly = alt.Chart(bars_df).encode(
            y=alt.Y("symptom:N", sort=symptoms, title=None, axis=alt.Axis(labelLimit=320)),
            tooltip=["symptom", alt.Tooltip("score:Q", format=".2f"), "experiment",
                     "evidence"])
        bars = lolly.mark_rule(color=charts.FAILURE_COLOUR, strokeWidth=3).encode(
            x=alt.X("threshold:Q", scale=alt.Scale(type="log"),
                    title="the checked number ÷ its threshold (1 = at the threshold)"),
            x2="score:Q") + lolly.mark_point(filled=True, size=90, opacity=1,
                                             color=charts.FAILURE_COLOUR).encode(x="score:Q")
        one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(
            strokeDash=[4, 3], color="#616161").encode(x="x:Q")
        ratios = alt.layer(bars, one).properties(
            width=charts.WIDTH, height=alt.Step(26),
            title=charts.titled("How far past its threshold the strongest case went",
                                ["symptoms read from a log line (a failed start, out of "
                                 "memory, a hang) have no number: see the table"]))
        return alt.vconcat(grid, ratios, spacing=30).resolve_scale(color="independent")

    def html(self, ev: Evidence) -> str:
        """The table as HTML, with links to the cited experiments' reports and the pages."""
        t = self.table(ev)
        t = t.astype(object).where(t.notna(), None)  # empty cells as None, never NaN
        stored, _ = machine_findings(ev)
        e = html.escape
        rows = []
        for r in t.itertuples():
            if r.seen:
                where = (f'<a href="{e(r.link)}">{e(r.experiment)}</a>' if r.link
                         else e(str(r.experiment)))
                seen = (f"{where} <code>{e(r.run_id)}</code>"
                        + (" <b>(induced)</b>" if r.induced else "")
                        + f"<br><q>{e(str(r.evidence))}</q>"
                        + f"<br><small>{r.seen} run(s) in {e(r.experiments)}</small>")
            else:
                seen = ("<i>not seen yet</i>" + (f": induce it with the part <code>"
                                                 f"{e(r.induce)}</code> of chapter 7's params"
                                                 if r.induce else ""))
            fix = e(r.fix) + f"<br><code>{e(r.setting)}</code>"
            if r.seen and r.hint:
                fix += f"<br><small>this run: {e(str(r.hint))}</small>"
            page = (f'<a href="{e(_report_link(stored, r.page_experiment))}">Fig {e(r.page)}'
                    "</a>" if r.page_experiment else f"Fig {e(r.page)}")
            if r.see_also:
                page += f"<br><small>see also Fig {e(r.see_also)}</small>"
            rows.append(f"<tr><td><b>{e(r.symptom)}</b><br><small>{e(r.threshold)}</small>"
                        f"</td><td>{e(r.check)}</td><td>{seen}</td><td>{fix}</td>"
                        f"<td>{page}</td></tr>")
        head = "".join(f"<th>{h}</th>" for h in ("symptom (rule)", "check", "seen here",
                                                 "fix", "page"))
        return ('<table class="tunebook-ch07" style="text-align:left;vertical-align:top">'
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")


def show_table(ev: Evidence) -> None:
    """Display Fig 7.1's table as HTML (the chapter notebook's last figure cell)."""
    from IPython.display import HTML, display

    from tunebook.figures.registry import get

    display(HTML(get("7.1").html(ev)))  # type: ignore[attr-defined]


# --- what chapter 7's params induce, checked (for live tests) ---------------------------------
def induced_findings(exp_dir: str | Path) -> dict[str, list[diagnose.Finding]]:
    """For one experiment of chapter 7's params: each rule that a part of its params induces
    (the rule's ``induce`` is a part name there) → its findings from that part's runs."""
    ev = load_evidence(exp_dir)
    parts = {str(p.get("name")) for p in ev.params.get("parts") or () if isinstance(p, dict)}
    found = diagnose.findings(diagnose.Stored.of([ev]))
    return {n: [f for f in found[n] if f.induced] for n, r in diagnose.RULES.items()
            if r.induce in parts}


def assert_induced(exp_dir: str | Path) -> dict[str, list[diagnose.Finding]]:
    """Raise AssertionError unless every symptom chapter 7's params induce was found in the
    runs of its part (preemptions counted by /metrics, the timed-out run); returns them."""
    got = induced_findings(exp_dir)
    if not got:
        raise AssertionError(f"{exp_dir}: its params have no part that induces a symptom")
    missing = [n for n, fs in got.items() if not fs]
    if missing:
        raise AssertionError(f"{exp_dir}: induced but not found: {', '.join(missing)} "
                             f"(found: {', '.join(n for n, fs in got.items() if fs) or 'none'})")
    return got
