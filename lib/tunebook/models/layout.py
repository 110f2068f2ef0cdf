"""Pick a parallel layout (Fig 6.1): does the model fit one GPU, how many GPUs and what links
them, and the goal → tensor, pipeline and data parallel sizes and the ``vllm serve`` flags.

    inputs = LayoutInputs(model="qwen3-8b", gpu_memory_gib=140.4, users=32,
                          context_tokens=8192, gpus_per_node=8, link="nvlink")
    answer = pick(inputs)          # Layout: sizes, flags, the fit numbers, and the reasons
    answer.flags                   # ['--tensor-parallel-size', '1', '--data-parallel-size', '8']

Pure: the answer is a function of the inputs only. The sizing is chapter 2's
(``tunebook.models.presets.kv_bytes_per_token`` and ``weights_gib_estimate``, from config.json).

The rules follow vLLM's guide "Parallelism and Scaling" (docs/serving/parallelism_scaling.md,
formerly "Distributed inference and serving"; https://docs.vllm.ai/en/latest/serving/
parallelism_scaling/):

- single GPU: "if the model fits on a single GPU, distributed inference is probably
  unnecessary"; spare GPUs then serve as data parallel replicas when the goal is throughput
  (docs/serving/data_parallel_deployment.md);
- single node, several GPUs: "if the model is too large for a single GPU but fits on a single
  node with multiple GPUs, use tensor parallelism";
- several nodes: "set tensor_parallel_size to the number of GPUs per node and
  pipeline_parallel_size to the number of nodes";
- edge cases: "if the GPUs on the node do not have NVLINK interconnect (e.g. L40S), leverage
  pipeline parallelism instead of tensor parallelism" (tensor parallelism all-reduces every
  layer's output; pipeline parallelism sends one activation per stage), and pipeline
  parallelism "supports uneven splits" of the layers where the GPU count does not divide the
  model.

vLLM refuses a tensor parallel size that does not divide the attention heads, and replicates
the KV heads when the size exceeds them; both are checked against config.json here.

``nvidia-smi topo -m`` answers "what links the GPUs" on a machine with GPUs
(``parse_topology``); without one (or with one GPU) the link is a question answered on paper.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

from tunebook.core.knobs import short
from tunebook.core.sections import SECTIONS, Checker, Section
from tunebook.models.presets import PRESETS, kv_bytes_per_token, weights_gib_estimate

Link = Literal["nvlink", "pcie", "network"]
Goal = Literal["latency", "throughput"]
LINKS: tuple[str, ...] = ("nvlink", "pcie", "network")
GOALS: tuple[str, ...] = ("latency", "throughput")
GIB = 2**30

DOCS = "https://docs.vllm.ai/en/latest/serving/parallelism_scaling/"


# --- inputs and answer ---------------------------------------------------------------------
@dataclass(frozen=True)
class LayoutInputs:
    """The three questions' inputs. Memory is per GPU; KV is what the target load holds."""

    model: str = "qwen3-8b"  # a preset (tunebook.models.presets.PRESETS); ``config`` overrides it
    gpu_memory_gib: float = 140.0  # one GPU's memory (nvidia-smi memory.total)
    gpu_memory_utilization: float = 0.9  # vLLM's budget: this fraction of the GPU
    users: int = 1  # target concurrency
    context_tokens: int = 8192  # tokens each user holds (prompt + output)
    kv_cache_dtype: str = "auto"
    quantization: str | None = None  # None or "fp8" (weights)
    dtype: str = "auto"
    gpus_per_node: int = 1
    nodes: int = 1
    link: Link = "nvlink"  # what links the GPUs of one node
    goal: Goal = "latency"
    # activation peak + non-torch memory + CUDA graphs per GPU: a planning allowance, not a
    # measurement (Fig 2.4 measures the real parts on a GPU)
    overhead_gib: float = 3.0
    kv_cache_memory_bytes: int | None = None  # a pinned KV pool per GPU (skips the budget)
    weights_gib: float | None = None  # when config.json cannot be counted (MoE, MLA)
    config: Mapping[str, Any] | None = field(default=None, compare=False)  # else the preset's

    def model_config(self) -> dict[str, Any]:
        if self.config is not None:
            return dict(self.config)
        if self.model not in PRESETS:
            raise LayoutError(f"model {self.model!r} is not a preset "
                              f"({', '.join(sorted(PRESETS))}); pass its config.json as config")
        return dict(PRESETS[self.model]["config"])

    def to_dict(self) -> dict[str, Any]:
        """The inputs as plain data (what the form edits); ``config`` is left out."""
        out = asdict(self)
        out.pop("config")
        return out


class LayoutError(ValueError):
    """Inputs the helper cannot answer: the message names the input."""


@dataclass(frozen=True)
class Fit:
    """Memory of one GPU under a layout (tp × pp GPUs hold one replica)."""

    tp: int
    pp: int
    weights_gib: float  # this GPU's share of the weights
    kv_needed_gib: float  # this GPU's share of the KV the target holds
    overhead_gib: float
    budget_gib: float  # what vLLM may use: memory × utilization (or the device, KV pinned)
    kv_available_gib: float  # budget − weights − overhead, or the pinned KV pool

    @property
    def margin_gib(self) -> float:
        """KV available − KV needed: negative means short."""
        return self.kv_available_gib - self.kv_needed_gib

    @property
    def weights_fit(self) -> bool:
        return self.kv_available_gib > 0

    @property
    def fits(self) -> bool:
        return self.weights_fit and self.margin_gib >= 0

    @property
    def needed_over_available(self) -> float:
        """(weights + overhead + KV needed) ÷ budget: at most 1 fits."""
        used = self.weights_gib + self.overhead_gib + self.kv_needed_gib
        if self.budget_gib <= 0:
            return math.inf
        return used / self.budget_gib if self.weights_fit else max(used / self.budget_gib, 1.0)


@dataclass(frozen=True)
class Layout:
    """The answer: sizes, the flags, the one-GPU fit numbers, and each decision's rule."""

    inputs: LayoutInputs
    one_gpu: Fit  # the model on one GPU
    chosen: Fit | None  # a GPU of the chosen layout (None: nothing the GPUs hold fits)
    tp: int
    pp: int
    dp: int
    reasons: tuple[str, ...]

    @property
    def fits_one_gpu(self) -> bool:
        return self.one_gpu.fits

    @property
    def fits(self) -> bool:
        return self.chosen is not None and self.chosen.fits

    @property
    def gpus_used(self) -> int:
        return self.tp * self.pp * self.dp

    @property
    def flags(self) -> list[str]:
        """``vllm serve`` flags of the layout (empty when nothing fits)."""
        if not self.fits:
            return []
        out = ["--tensor-parallel-size", str(self.tp)]
        if self.pp > 1:
            out += ["--pipeline-parallel-size", str(self.pp)]
        if self.dp > 1:
            out += ["--data-parallel-size", str(self.dp)]
        i = self.inputs
        if i.quantization:
            out += ["--quantization", str(i.quantization)]
        if i.kv_cache_dtype != "auto":
            out += ["--kv-cache-dtype", i.kv_cache_dtype]
        return out

    def command(self) -> str:
        if not self.fits:
            return "(no layout of these GPUs holds the model and its KV cache)"
        return " ".join(["vllm serve", self.inputs.model, *self.flags])

    def summary(self) -> str:
        if not self.fits:
            return "does not fit: " + self.reasons[-1]
        return (f"TP {self.tp} × PP {self.pp} × DP {self.dp} = {self.gpus_used} GPU(s) of "
                f"{self.inputs.gpus_per_node * self.inputs.nodes}")


# --- sizing (chapter 2's) --------------------------------------------------------------------
def model_weights_gib(i: LayoutInputs) -> float:
    """Weight GiB from config.json (chapter 2's estimate), or the inputs' own."""
    if i.weights_gib is not None:
        return float(i.weights_gib)
    w = weights_gib_estimate(i.model_config(), i.dtype, i.quantization)
    if w is None:
        raise LayoutError(f"weights of {i.model!r} cannot be counted from config.json "
                          "(MoE or MLA layout): give weights_gib")
    return w


def _heads(config: Mapping[str, Any]) -> tuple[int, int, int]:
    c = config.get("text_config", config)
    heads = int(c["num_attention_heads"])
    return heads, int(c.get("num_key_value_heads") or heads), int(c["num_hidden_layers"])


def fit(i: LayoutInputs, tp: int = 1, pp: int = 1) -> Fit:
    """One GPU's memory when tp × pp GPUs hold the model. Weights and KV split over tp × pp;
    with tp above the KV heads vLLM replicates them, so each GPU keeps one KV head."""
    config = i.model_config()
    _, kv_heads, _ = _heads(config)
    kv_total = i.users * i.context_tokens * kv_bytes_per_token(config, i.kv_cache_dtype) / GIB
    kv_share = max(kv_heads / tp, 1.0) / kv_heads / pp
    weights = model_weights_gib(i) / (tp * pp)
    if i.kv_cache_memory_bytes is not None:  # vLLM skips the budget: the pool is fixed
        budget = i.gpu_memory_gib
        pool = i.kv_cache_memory_bytes / GIB
        available = pool if weights + i.overhead_gib + pool <= budget else \
            budget - weights - i.overhead_gib - pool
    else:
        budget = i.gpu_memory_gib * i.gpu_memory_utilization
        available = budget - weights - i.overhead_gib
    return Fit(tp, pp, weights, kv_total * kv_share, i.overhead_gib, budget, available)


def fit_text(f: Fit) -> str:
    return (f"weights {f.weights_gib:,.2f} + overhead {f.overhead_gib:g} GiB, KV needed "
            f"{f.kv_needed_gib:,.3g} GiB, KV available {f.kv_available_gib:,.3g} GiB of a "
            f"{f.budget_gib:,.1f} GiB budget (margin {f.margin_gib:+,.3g} GiB)")


# --- the rules ---------------------------------------------------------------------------------
def tp_sizes(i: LayoutInputs, most: int) -> tuple[list[int], list[str]]:
    """Tensor parallel sizes up to ``most`` that divide the attention heads (vLLM refuses
    others), and a reason for each size it rejected."""
    heads, kv_heads, _ = _heads(i.model_config())
    ok, rejected = [], []
    for t in range(1, most + 1):
        if heads % t:
            rejected.append(f"TP {t} rejected: {heads} attention heads do not divide by {t}")
        elif kv_heads % t and t % kv_heads:
            rejected.append(f"TP {t} rejected: {kv_heads} KV heads neither divide by {t} nor "
                            f"divide it (vLLM splits or replicates whole KV heads)")
        else:
            ok.append(t)
    # only the node's own GPU count is worth a reason: smaller sizes are fallbacks
    return ok, [r for r in rejected if r.startswith(f"TP {most} ")]


def _pp_note(i: LayoutInputs, pp: int) -> str | None:
    _, _, layers = _heads(i.model_config())
    if pp > 1 and layers % pp:
        return (f"{layers} layers do not divide by PP {pp}: vLLM splits them unevenly "
                f"({layers // pp}–{layers // pp + 1} per stage; VLLM_PP_LAYER_PARTITION "
                "sets it)")
    if pp > layers:
        return f"PP {pp} exceeds the {layers} layers"
    return None


def pick(i: LayoutInputs) -> Layout:
    """The layout for ``i`` (rules in the module docstring, each decision in ``reasons``)."""
    check(i)
    n_node, nodes = i.gpus_per_node, i.nodes
    one = fit(i)
    reasons = [f"one GPU: {fit_text(one)}"]
    if one.fits:
        reasons.append("fits one GPU → no tensor or pipeline parallelism (vLLM: "
                       "'distributed inference is probably unnecessary')")
        total = n_node * nodes
        if i.goal == "throughput" and total > 1:
            reasons.append(f"goal throughput → {total} data parallel replicas, one per GPU "
                           "(each holds the whole model; requests spread over them)")
            return Layout(i, one, one, 1, 1, total, tuple(reasons))
        if total > 1:
            reasons.append(f"goal latency → one replica; the other {total - 1} GPU(s) add "
                           "no speed to one request without tensor parallelism (set goal "
                           "throughput for replicas)")
        return Layout(i, one, one, 1, 1, 1, tuple(reasons))

    reasons.append("does not fit one GPU → split the model")
    tps, rejected = tp_sizes(i, n_node)
    fast = i.link == "nvlink" and n_node > 1
    if fast:
        reasons += rejected
    if n_node > 1 and not fast:
        reasons.append(f"link {i.link} inside the node → pipeline parallelism instead of "
                       "tensor parallelism (vLLM: without NVLink 'leverage pipeline "
                       "parallelism'; TP all-reduces every layer over the link)")
        tps = [1]

    def fitting(tp: int, pps: range) -> tuple[int, Fit] | None:
        for pp in pps:
            f = fit(i, tp, pp)
            if f.fits and not (_pp_note(i, pp) or "").startswith("PP"):
                return pp, f
        return None

    # Inside one node first: TP over NVLink, else PP over the node's GPUs.
    if fast:
        pick_tp = [t for t in tps if fit(i, t).fits]
        if pick_tp:
            tp = max(tps) if i.goal == "latency" else min(pick_tp)
            f = fit(i, tp)
            dp = (n_node // tp) * nodes  # replicas of the TP group on the remaining GPUs
            if i.goal == "latency":
                reasons.append(f"fits one node over NVLink; goal latency → TP {tp}, the "
                               "most GPUs of the node the heads allow (each step reads 1/TP "
                               "of the weights)" + (f", × DP {dp} replicas" if dp > 1 else ""))
            else:
                reasons.append(f"fits one node over NVLink; goal throughput → TP {tp}, the "
                               f"fewest GPUs that hold it, × DP {dp} replicas")
            reasons.append(f"each GPU: {fit_text(f)}")
            return Layout(i, one, f, tp, 1, dp, tuple(reasons))
        reasons.append(f"no TP size the heads allow ({', '.join(map(str, tps))}) holds it "
                       "on this node → pipeline parallelism over the node's GPUs (vLLM's "
                       "edge case: PP 'supports uneven splits')")
    if n_node > 1:
        got = fitting(1, range(2, n_node + 1))
        if got:
            pp, f = got
            dp = (n_node // pp) * nodes if i.goal == "throughput" else 1
            reasons.append(f"fits one node as PP {pp} (the fewest stages that hold it)"
                           + (f" × DP {dp} replicas (goal throughput)" if dp > 1 else ""))
            note = _pp_note(i, pp)
            if note:
                reasons.append(note)
            reasons.append(f"each GPU: {fit_text(f)}")
            return Layout(i, one, f, 1, pp, dp, tuple(reasons))

    # Across nodes: TP inside each node, PP across the nodes (vLLM's multi-node rule).
    if nodes > 1:
        tp = max(tps) if fast else 1
        per_node = n_node // tp  # pipeline stages inside a node when TP cannot span it
        got = fitting(tp, range(per_node * 1, per_node * nodes + 1))
        if got:
            pp, f = got
            reasons.append(f"does not fit one node → TP {tp} inside each node × PP {pp} "
                           "across the nodes (vLLM: TP = GPUs per node, PP = nodes)")
            note = _pp_note(i, pp)
            if note:
                reasons.append(note)
            reasons.append(f"each GPU: {fit_text(f)}")
            return Layout(i, one, f, tp, pp, 1, tuple(reasons))
    tp_all = max(tps) if fast else 1
    pp_all = (n_node // tp_all) * nodes
    best = fit(i, tp_all, pp_all)
    reasons.append(f"even all {n_node * nodes} GPU(s) (TP {tp_all} × PP {pp_all}) are short: "
                   f"{fit_text(best)}; add GPUs or nodes, quantize the weights (fp8) or the "
                   "KV cache (kv_cache_dtype fp8), or lower users × context")
    return Layout(i, one, None, tp_all, pp_all, 1, tuple(reasons))


def check(i: LayoutInputs) -> None:
    """Clear errors for inputs no layout can answer."""
    problems = []
    for name in ("gpu_memory_gib", "gpu_memory_utilization", "overhead_gib"):
        v = getattr(i, name)
        if not isinstance(v, int | float) or isinstance(v, bool):
            raise LayoutError(f"{name} must be a number, got {v!r}")
    if i.link not in LINKS:
        problems.append(f"link must be one of {', '.join(LINKS)}, got {i.link!r}")
    if i.goal not in GOALS:
        problems.append(f"goal must be one of {', '.join(GOALS)}, got {i.goal!r}")
    for name in ("users", "context_tokens", "gpus_per_node", "nodes"):
        v = getattr(i, name)
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            problems.append(f"{name} must be a positive integer, got {v!r}")
    if not 0 < i.gpu_memory_utilization <= 1:
        problems.append("gpu_memory_utilization must be a fraction in (0, 1], got "
                        f"{i.gpu_memory_utilization!r}")
    if not i.gpu_memory_gib > 0:
        problems.append(f"gpu_memory_gib must be positive, got {i.gpu_memory_gib!r}")
    if i.quantization not in (None, "fp8"):
        problems.append(f"quantization must be null or fp8, got {i.quantization!r}")
    if problems:
        raise LayoutError("; ".join(problems))


def inputs_from(data: Mapping[str, Any], base: LayoutInputs | None = None) -> LayoutInputs:
    """LayoutInputs from a mapping (a params ``layout:`` section, the form's values): unknown
    keys and wrong types are refused with the key named."""
    names = {f.name: f for f in fields(LayoutInputs) if f.name != "config"}
    unknown = sorted(set(data) - set(names))
    if unknown:
        raise LayoutError(f"unknown layout input(s) {', '.join(unknown)}; known: "
                          f"{', '.join(names)}")
    out = replace(base or LayoutInputs(), **dict(data))
    check(out)
    return out


# --- nvidia-smi topo -m ------------------------------------------------------------------------
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_DEVICE = re.compile(r"^(GPU\d+|NIC\d+)$")
_NV = re.compile(r"^NV(\d+)$")
PCIE_LINKS = ("PIX", "PXB", "PHB", "NODE", "SYS")


@dataclass(frozen=True)
class Topology:
    """What ``nvidia-smi topo -m`` says about the GPUs of this node."""

    gpus: int
    matrix: dict[tuple[int, int], str]  # (i, j) → X, NV#, PIX, PXB, PHB, NODE or SYS

    @property
    def link(self) -> Link | None:
        """nvlink when every pair of GPUs has NVLink; pcie when any pair goes over PCIe (TP
        all-reduces over every pair); None with one GPU (no link to read)."""
        pairs = [v for (a, b), v in self.matrix.items() if a < b]
        if not pairs:
            return None
        return "nvlink" if all(_NV.match(v) for v in pairs) else "pcie"

    def describe(self) -> str:
        pairs = sorted({v for (a, b), v in self.matrix.items() if a < b})
        if not pairs:
            return f"{self.gpus} GPU: no link between GPUs to read"
        return f"{self.gpus} GPUs, links between them: {', '.join(pairs)} → {self.link}"


def parse_topology(text: str | None) -> Topology | None:
    """The GPU count and GPU-to-GPU link matrix of ``nvidia-smi topo -m``; None without a
    GPU row (no nvidia-smi, no GPU, or an error message)."""
    if not text:
        return None
    lines = [_ANSI.sub("", ln).rstrip() for ln in text.splitlines()]
    header = next((ln for ln in lines if re.search(r"\bGPU0\b", ln)
                   and not ln.lstrip().startswith("GPU0 ")
                   and not re.match(r"\s*GPU0\s+X\b", ln)), None)
    if header is None:
        return None
    cols = []
    for tok in header.split():
        if _DEVICE.match(tok):
            cols.append(tok)
        elif cols:
            break
    gpu_cols = [c for c in cols if c.startswith("GPU")]
    matrix: dict[tuple[int, int], str] = {}
    rows = 0
    for ln in lines:
        toks = ln.split()
        if not toks or not re.match(r"^GPU\d+$", toks[0]) or len(toks) < len(cols) + 1:
            continue
        a = int(toks[0][3:])
        rows += 1
        for name, cell in zip(cols, toks[1:len(cols) + 1], strict=True):
            if name.startswith("GPU"):
                matrix[(a, int(name[3:]))] = cell
    if rows == 0:
        return None
    return Topology(len(gpu_cols), matrix)


def read_topology() -> Topology | None:
    """This machine's topology (None without nvidia-smi or a GPU)."""
    from tunebook.core.hardware import nvidia_smi_topo

    return parse_topology(nvidia_smi_topo())


# --- this machine, and what only paper answers -------------------------------------------------
def on_machine(i: LayoutInputs, machine: Mapping[str, Any]) -> tuple[LayoutInputs, list[str]]:
    """``i`` with the GPU count, link and memory this machine answers (from recorded machine
    facts: ``gpu_memory_gib`` and the ``gpu_topology`` text), and the questions it could only
    answer on paper (stated in the inputs)."""
    topo = parse_topology(machine.get("gpu_topology"))
    mem = machine.get("gpu_memory_gib")
    paper = []
    changes: dict[str, Any] = {}
    if topo is None:
        paper.append(f"no GPU here: the GPU's memory ({i.gpu_memory_gib:g} GiB), the GPU count "
                     f"({i.gpus_per_node} per node × {i.nodes} node(s)) and the link "
                     f"({i.link}) are the inputs' — answered on paper")
        return i, paper
    changes["gpus_per_node"] = topo.gpus
    if isinstance(mem, int | float) and mem > 0:
        changes["gpu_memory_gib"] = float(mem)
    if topo.link is not None:
        changes["link"] = topo.link
    else:
        paper.append(f"one GPU here: what links GPUs ({i.link}) and every split over "
                     "several GPUs (TP, PP, DP) are answered on paper")
    if i.nodes > 1:
        paper.append(f"{i.nodes} nodes: the network between nodes is answered on paper")
    return replace(i, **changes), paper


# --- the form ------------------------------------------------------------------------------------
def answer_markdown(i: LayoutInputs) -> str:
    """The answer as markdown: the verdict, the command, and each decision's rule."""
    try:
        a = pick(i)
    except (LayoutError, ValueError, KeyError) as e:
        return f"**Cannot answer:** {e}"
    head = (f"**{a.summary()}** — fits one GPU: **{'yes' if a.fits_one_gpu else 'no'}** "
            f"({i.model}, {i.users} users × {i.context_tokens:,} tokens, "
            f"{i.gpus_per_node} GPU(s)/node × {i.nodes} node(s) of {i.gpu_memory_gib:g} GiB, "
            f"link {i.link}, goal {i.goal})")
    return "\n".join([head, "", f"`{a.command()}`", "", *[f"- {r}" for r in a.reasons],
                      "", f"Rules: vLLM, [Parallelism and Scaling]({DOCS})."])


FORM_FIELDS: tuple[str, ...] = (
    "model", "gpu_memory_gib", "gpu_memory_utilization", "users", "context_tokens",
    "kv_cache_dtype", "quantization", "gpus_per_node", "nodes", "link", "goal", "overhead_gib",
)


class LayoutForm:
    """ipywidgets that edit only a LayoutInputs; the answer is ``answer_markdown(inputs())``."""

    def __init__(self, inputs: LayoutInputs):
        import ipywidgets as W

        self.base = inputs
        style = {"description_width": "200px"}
        lay = W.Layout(width="380px")
        self.w: dict[str, Any] = {
            "model": W.Dropdown(options=sorted(PRESETS), value=inputs.model
                                if inputs.model in PRESETS else None),
            "gpu_memory_gib": W.BoundedFloatText(min=0.1, max=1e6, value=inputs.gpu_memory_gib),
            "gpu_memory_utilization": W.BoundedFloatText(
                min=0.01, max=1.0, step=0.01, value=inputs.gpu_memory_utilization),
            "users": W.BoundedIntText(min=1, max=10**6, value=inputs.users),
            "context_tokens": W.BoundedIntText(min=1, max=10**8, value=inputs.context_tokens),
            "kv_cache_dtype": W.Dropdown(options=["auto", "fp8"], value=inputs.kv_cache_dtype
                                         if inputs.kv_cache_dtype in ("auto", "fp8") else "auto"),
            "quantization": W.Dropdown(options=[("none", None), ("fp8", "fp8")],
                                       value=inputs.quantization),
            "gpus_per_node": W.BoundedIntText(min=1, max=64, value=inputs.gpus_per_node),
            "nodes": W.BoundedIntText(min=1, max=1024, value=inputs.nodes),
            "link": W.Dropdown(options=list(LINKS), value=inputs.link),
            "goal": W.ToggleButtons(options=list(GOALS), value=inputs.goal),
            "overhead_gib": W.BoundedFloatText(min=0, max=1e4, value=inputs.overhead_gib),
        }
        for name, widget in self.w.items():
            widget.description = name
            widget.style = style
            widget.layout = lay
        self.out = W.Output()
        self.text = ""  # the answer shown, as markdown
        for widget in self.w.values():
            widget.observe(lambda _: self.refresh(), names="value")
        self.refresh()

    def values(self) -> dict[str, Any]:
        return {k: w.value for k, w in self.w.items()}

    def set_values(self, values: Mapping[str, Any]) -> None:
        """Set form fields (FORM_FIELDS); the other inputs stay the base's."""
        unknown = sorted(set(values) - set(self.w))
        if unknown:
            raise LayoutError(f"not form fields: {', '.join(unknown)}; the form edits "
                              f"{', '.join(self.w)}")
        for k, v in values.items():
            self.w[k].value = v

    def inputs(self) -> LayoutInputs:
        return inputs_from(self.values(), replace(self.base, config=None))

    def refresh(self) -> None:
        from IPython.display import Markdown, display

        try:
            self.text = answer_markdown(self.inputs())
        except LayoutError as e:
            self.text = f"**Cannot answer:** {e}"
        self.out.clear_output()
        with self.out:
            display(Markdown(self.text))

    def widget(self):  # -> ipywidgets.HBox
        import ipywidgets as W

        return W.HBox([W.VBox(list(self.w.values())), self.out])


def form(inputs: LayoutInputs) -> LayoutForm:
    return LayoutForm(inputs)


# -- the params section `layout:` ----------------------------------------------------------------

# The `layout:` keys that are not LayoutInputs fields: the chapter-2 experiment folder whose
# starts the helper is checked on (relative to the project), and where the machine's values
# come from (auto: GPU count, link and memory from this machine where it has GPUs; paper: the
# values given).
EXTRA_KEYS = ("check_against", "machine")
MACHINES = ("auto", "paper")


class LayoutSection(Section[dict[str, Any]]):
    """Fig 6.1's inputs in a params file (chapter 6's figures read them back from the stored
    params), checked here so a bad input is an error before anything runs."""

    key = "layout"
    default: dict[str, Any] = {}

    def read(self, v: Checker, raw: Any) -> dict[str, Any]:
        if raw is None:
            return {}
        if not isinstance(raw, dict):
            v.err(self.key, f"must be a mapping of layout inputs (model: ..., users: ...), "
                            f"got {type(raw).__name__}")
            return {}
        check = raw.get("check_against")
        if check is not None and (not isinstance(check, str) or not check.strip()):
            v.err(f"{self.key}.check_against", "must be a folder path (an experiment of "
                                               f"chapter 2), got {short(check)}")
        if raw.get("machine", "auto") not in MACHINES:
            v.err(f"{self.key}.machine", f"must be one of {', '.join(MACHINES)}, got "
                                         f"{short(raw.get('machine'))}")
        try:
            inputs_from({k: x for k, x in raw.items() if k not in EXTRA_KEYS})
        except (LayoutError, TypeError) as e:
            v.err(self.key, str(e))
        return dict(raw)

    def dump(self, value: dict[str, Any]) -> Any:
        return dict(value)


SECTION = SECTIONS.add(LayoutSection.key, LayoutSection())
