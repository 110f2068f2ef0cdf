# ruff: noqa: E501  (cell texts are prose and code as it reads in the notebook)
"""Write notebooks/*.ipynb (without outputs) from the cell texts below.

    .venv/bin/python scripts/make_notebooks.py        # rewrite every notebook
    .venv/bin/python scripts/make_notebooks.py --check  # exit 1 if a notebook differs

Notebooks narrate and call into tunebook; every cell here is one line of narrative or one call.
Keeping their source here makes review diffs readable and the parameters cells uniform.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat as nbf

from tunebook import figures

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
md = nbf.v4.new_markdown_cell
code = nbf.v4.new_code_cell


def parameters(params_file: str) -> nbf.NotebookNode:
    cell = code(f'''params_file: str = "{params_file}"  # the sweep definition (YAML), relative to notebooks/
overrides: dict = {{}}  # dotted-key overrides applied on top of the file, e.g. {{"load.users": [1, 2]}}
outputs: str = "../outputs"  # the outputs root: runs land in its <machine>/<experiment>/; another folder: <outputs>/<experiment>/
dry_run: bool = False  # True: print the plan and start no engine''')
    cell.metadata["tags"] = ["parameters"]
    return cell


SETUP = '''from IPython.display import Markdown, display

from tunebook.charts import plots as charts
from tunebook.present import workbook

wb = workbook.open(params_file, overrides, outputs, dry_run=dry_run)
display(Markdown(wb.header()))'''

RUN = [
    md("## The plan\nOne engine start per engine config; its load points run inside it. "
       "`done` runs are skipped."),
    code("print(wb.plan())"),
    md("## Run the sweep\nA progress bar follows each engine start (by the phase vLLM logs) and "
       "each load point. An engine config that cannot start is recorded with the log line that "
       "explains it, and the sweep goes on."),
    code("result = wb.run()"),
    md("## Since the last measurement\nA scheduled run (`tunebook run … --again`) is a dated "
       "measurement of the whole plan: what changed since the previous one beyond noise, per "
       "load point and metric, comes first."),
    code("wb.changes()"),
]

STARTS = [
    md("## Where the engine starts' time went\nEach engine start cut into its phases at vLLM's "
       "own log lines: imports, engine core, device set-up, weights, torch.compile (and whether "
       "its cache hit), profiling and the KV cache, CUDA graphs, warm-up, the API server. "
       "`tunebook engines --phases <experiment>` prints the same table."),
    code("wb.show_start_phases()"),
]

CLAIMS = [
    md("## Claims, checked\nEach figure this experiment targets: the manual's claim, what was "
       "measured here, and the verdict (*holds*, *differs*, *cannot run here*, *not measured*) "
       "with the rule applied. `tunebook claims outputs/<machine>` builds the same table across "
       "experiments."),
    code("wb.show_claims()"),
]


def quickstart() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [
        md("""# tunebook quickstart: concurrency scaling of one vLLM engine

This notebook starts a **real vLLM engine** for each engine config in the params file, loads it with
**vLLM's own benchmark client** (`vllm bench serve`, in-process) at each number of concurrent users,
stores every run as its own JSON file (plus a Parquet table), and charts the results **beside the
figure of the vLLM manual that makes the same claim**. The manual's numbers are reference data from
its own machines (DGX Spark, L4); they are labelled as such and never mixed with what was measured here.

Run it interactively, or unattended: `tunebook run params/quickstart.yaml` (papermill renders it into
`outputs/<experiment>/` with a self-contained HTML report). Running it again resumes: finished runs are skipped."""),
        parameters("../params/quickstart.yaml"),
        code(SETUP),
        *RUN,
        md("## The figures this experiment targets\nEach figure the params list (`figures:`), "
           "beside the manual's: the verdict line with its rule, then the chart. Ratio claims "
           "lead with the measured ratio beside the manual's (absolute numbers from different "
           "machines are not comparable), the absolute curves second."),
        code("wb.figures()"),
        md("## Latency percentiles\np50 / p90 / p99 time per output token against users, one "
           "line per engine config."),
        code('charts.latency_percentiles(wb.table(), "tpot") if len(wb.table()) else None'),
        md("## What the tokens cost\nPer engine config, its cheapest tokens (USD per million "
           "output tokens at your price, params `cost:`; else the GPUs' joules per output token) "
           "against its p99 time per output token; the configs no other beats on both are "
           "joined."),
        code("wb.cost()"),
        *STARTS,
        md("## The numbers\nHeadline metrics (vLLM's own names and units), then every run that did "
           "not succeed, with the engine log line that explains it and the setting to change."),
        code("wb.summary()"),
        code("wb.failures()"),
    ]
    return nb


def chapter(ch: figures.Chapter) -> nbf.NotebookNode:
    """A chapter notebook, from the registry: intro, parameters, setup, the run, then per
    figure its narrative and `wb.figure(id)`, then the numbers and the claims table."""
    nb = nbf.v4.new_notebook()
    cells = [md(f"# Chapter {ch.number} — {ch.title}\n\n{ch.intro}"),
             parameters(f"../params/ch{ch.number:02d}.yaml"), code(SETUP), *RUN]
    for unit in ch.figures:
        cells += [md(f"## Fig {unit.fig} — {unit.title}\n{unit.narrative}".rstrip()),
                  code(f'wb.figure("{unit.fig}")')]
    for text, call in ch.extras:
        cells += [md(text), code(call)]
    cells += [*STARTS, md("## The numbers\nStart-up facts per engine config, the headline metrics per "
                 "load point, and every run that did not succeed with the line that explains it."),
              code("wb.startup_facts()"), code("wb.summary()"), code("wb.failures()"), *CLAIMS]
    nb.cells = cells
    return nb


def tune() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    cell = code('''params_file: str = "../params/tune.yaml"  # where the panel starts (YAML), relative to notebooks/
overrides: dict = {}  # dotted-key overrides applied on top of the file, e.g. {"load.users": [1, 2]}
outputs: str = "../outputs"  # the outputs root: runs land in its <machine>/<experiment>/
interactive: bool = True  # False (tunebook run, papermill): run the params once, no clicks
dry_run: bool = False  # with interactive False: start nothing, show the stored results''')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [
        md("# Tune an engine by hand\n"
           "Pick the model, the engine knobs and the load, then press **Run**: a progress bar "
           "follows the engine start and each load point, each engine config's start-up facts "
           "read as a line of words and units, and the chart grows as each point lands.\n\n"
           "- A knob field left empty (or at its *vLLM default* entry) shows vLLM's own default, "
           "read from the installed vLLM; None there means vLLM decides at start-up.\n"
           "- Each engine config you Run stays on the chart as its own curve, labelled by what "
           "sets it apart: try three and compare them. Unselect one in **shown on the chart** to "
           "drop its curve (its results stay stored).\n"
           "- Changing only **load** settings reuses the running engine; changing an **engine** "
           "knob restarts it on the next Run. **Stop engine** frees the machine.\n"
           "- Everything the panel runs is replayable: each run records its params under "
           "`outputs/<machine>/<experiment>/inputs/`, and **Save as params** writes a YAML file that "
           "`tunebook run` replays unattended (same plan, same run ids, so finished runs are "
           "skipped).\n"
           "- A value the params would reject (users `1, x`, a fraction above 1) is reported "
           "in the panel; no engine starts."),
        cell,
        code("from tunebook.present import panel as tune\n\n"
             "panel = tune.panel(params_file, overrides, outputs)\n"
             "panel.show(interactive, dry_run=dry_run)"),
        md("## The params behind the panel\nThe dry run of the panel's params as they were when "
           "this cell ran (run it again after editing; `tunebook plan` prints the same for a "
           "saved file)."),
        code("print(panel.plan().describe())"),
    ]
    return nb


def slo_notebook() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [
        md("""# From an SLO to the best config

Name the bounds a deployment must meet (`slo:`, e.g. p99 TPOT ≤ 30 ms and p99 TTFT ≤ 1 s) and
the knobs to search (`search:`); tunebook finds the engine config that serves the most while
meeting them, without running the whole grid:

- **within a config** it bisects the load levels for the highest one that meets the SLO, and stops
  climbing past saturation;
- **across configs** the baseline (`search.baseline`, e.g. vLLM's defaults) goes first, then
  Optuna's TPE proposes the next config from the ones measured (numeric knobs as ordered values);
  a new config is first tried at the best config's load level and cut short as soon as a point
  that misses the SLO serves no more than the best so far (it cannot win);
- it ends when `budget.patience` configs in a row beat no best (by `budget.min_gain`: a gain
  smaller than the run-to-run noise does not count), or at the budget (configs, minutes); the
  summary says what the answer cost in engine time, and how it compares with the baseline at
  the same SLO.

Every point is an ordinary stored run: running this again resumes, and reuses every stored point.
Unattended: `tunebook tune params/slo.yaml` (exit 0: found, 1: no config meets the SLO)."""),
        parameters("../params/slo.yaml"),
        code("""from tunebook.charts import plots as charts
from tunebook.present import workbook
from tunebook.search import tune as slo_search

summary = workbook.search(params_file, overrides, outputs, dry_run=dry_run)"""),
        md("## Every evaluated point\nThe first SLO metric against the objective; crosses miss "
           "the SLO, the dashed line is the frontier of the points that meet it, the ring is "
           "the answer."),
        code("charts.slo_points(summary) if summary else None"),
        md("## Where the search went\nEach engine config of the space: its score within the "
           "SLO and the order the search tried it in; the cells left blank were never started."),
        code("charts.slo_configs(summary) if summary else None"),
        md("## Each engine config the search tried\nIts score (the objective at its best point "
           "within the SLO) and how its search ended: the highest level, saturation, or cut "
           "short because it could not beat the best."),
        code("slo_search.configs_table(summary)"),
    ]
    return nb


def traces_notebook() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [
        md("""# Real traffic: replaying production traces

The load of every other chapter is synthetic. Here it is a **workload file**: a production request
trace (arrival times, prompt and answer lengths, shared-prefix blocks) or a prompt set, sent by
**vLLM's own benchmark client** — Mooncake-style traces through its `timed_trace` dataset, on the
trace's own clock, CSV traces (Azure LLM inference, BurstGPT) converted to it, ShareGPT and JSONL
prompt files through its `sharegpt` and `custom` datasets.

A replay's load axis is its **speed**: 2× sends the same requests at twice the trace's rate. What
was cut and scaled for this machine (a window, `length_scale`, caps) is in every row and in the run
id. A run is judged by **goodput**: the requests that met every per-request bound (`goodput:`).

Unattended: `tunebook run params/traces.yaml`. Bring your own file: `load.file`, and
`tunebook plan` checks it line by line before any engine starts."""),
        parameters("../params/traces.yaml"),
        code(SETUP),
        *RUN,
        md("## The workload: asked and sent\nPer trace: what the file asked (its prepared "
           "requests, at the fastest replay speed) beside what vLLM's client sent, then per run "
           "the goodput and the prefix cache the trace's hash ids predict beside the engine's "
           "own hits."),
        code("wb.workload()"),
        md("## Throughput and latency as the trace speeds up\nOne curve per engine config: "
           "output throughput, then p99 time to first token, against the replay speed."),
        code('wb.replay("output_tok_s")'),
        code('wb.replay("p99_ttft_ms")'),
        md("## Goodput\nRequests per second that met every bound, and the share of those "
           "sent: where the trace's traffic stops being served well on this machine."),
        code('wb.replay("request_goodput_req_s")'),
        code('wb.replay("slo_attainment")'),
        md("## What the tokens cost\nPer engine config, its cheapest tokens (USD per million "
           "output tokens at your price, params `cost:`; else the GPUs' joules per output token) "
           "against its p99 time per output token; the configs no other beats on both are "
           "joined."),
        code("wb.cost()"),
        *STARTS,
        md("## The numbers\nPer engine config and replay speed, then every run that did not "
           "succeed, with the line that explains it."),
        code("wb.summary()"),
        code("wb.failures()"),
    ]
    return nb


BUILDERS = {"00_quickstart": quickstart, "10_tune": tune, "20_slo": slo_notebook,
            "30_traces": traces_notebook,
            **{ch.notebook: (lambda ch=ch: chapter(ch)) for ch in figures.CHAPTERS.values()
               if ch.notebook}}


def main(argv: list[str]) -> int:
    check = "--check" in argv
    stale = []
    for name, build in BUILDERS.items():
        nb = build()
        for i, cell in enumerate(nb.cells):
            cell.id = f"cell-{i:02d}"  # stable ids: regenerating gives no diff
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                     "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        path = NOTEBOOKS / f"{name}.ipynb"
        text = nbf.writes(nb)
        if check:
            old = nbf.reads(path.read_text(), as_version=4) if path.exists() else None
            if old is None or [c.source for c in old.cells] != [c.source for c in nb.cells]:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date (run scripts/make_notebooks.py): {', '.join(stale)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
