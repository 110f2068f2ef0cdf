"""Fig 6.1's layout helper (tunebook.models.layout), no engine: its fit verdict on every stored
start of chapter 2 (CPU and H200), multi-GPU layouts on paper, the `nvidia-smi topo -m` parser on
constructed samples (tests/data/topo, marked as such), the params `layout:` section and the
form's values."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from conftest import Replot
from tunebook.figures import ch06_layouts as C
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.models import layout as L
from tunebook.models.presets import PRESETS
from tunebook.present import claims
from tunebook.results.evidence import load_evidence

REPO = Path(__file__).resolve().parents[2]
TOPO = REPO / "tests" / "data" / "topo"
H200_GIB = 140.4  # nvidia-smi's memory.total of an H200 (143,771 MiB): a spec, on paper

# A Llama-3-70B-shaped config (80 layers, 64 heads, 8 KV heads): ~131 GiB of BF16 weights.
LLAMA70B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8192,
            "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
            "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
            "torch_dtype": "bfloat16", "tie_word_embeddings": False}


def big(**kw: object) -> L.LayoutInputs:
    return L.LayoutInputs(model="llama-70b-shape", config=LLAMA70B, gpu_memory_gib=H200_GIB,
                          users=32, context_tokens=8192, **kw)  # type: ignore[arg-type]


# --- chapter 2's starts ---------------------------------------------------------------------
@pytest.mark.parametrize("machine", ["cpu", "h200"])
def test_fit_verdict_agrees_with_every_chapter2_start(machine: str) -> None:
    t = C.start_checks(load_evidence(REPO / "outputs" / machine / "ch02"))
    assert len(t) >= 4
    judged = t[t.outcome != C.FAILED_OTHER]
    assert set(judged.outcome) == {C.STARTED, C.FAILED_MEMORY}
    # a start that failed for lack of memory is never told it fits; every start that ran is
    assert (judged[judged.outcome == C.FAILED_MEMORY].helper == "does not fit").all()
    assert (judged[judged.outcome == C.STARTED].helper == "fits").all()
    assert judged.agrees.astype(bool).all()


def test_chapter2_failures_by_kind() -> None:
    t = C.start_checks(load_evidence(REPO / "outputs" / "h200" / "ch02")).set_index("engine_label")
    # Qwen1.5-110B: ~207 GiB of weights on a 140 GiB GPU leave no room at all
    assert t.loc["model=qwen1.5-110b", "kv_available_gib"] < 0
    # 40,960 tokens need 5.62 GiB of KV (vLLM's own number) in a 2 GiB pool
    row = t.loc["max_model_len=40960, kv_cache_memory_bytes=2147483648"]
    assert row.kv_needed_gib == pytest.approx(5.625) and row.kv_available_gib == 2
    cpu = C.start_checks(load_evidence(REPO / "outputs" / "cpu" / "ch02")).set_index("engine_label")
    # FP8 KV refused by this CPU: no memory failure, listed but not judged
    fp8 = cpu.loc["kv_cache_memory_bytes=1073741824, kv_cache_dtype=fp8"]
    assert fp8.outcome == C.FAILED_OTHER and fp8.agrees is None


def test_rule_holds_on_stored_chapter2(tmp_path: Path) -> None:
    ev = load_evidence(tmp_path)  # a figures-only experiment: params only, no rows
    for machine in ("cpu", "h200"):
        ev.params = {"model": "qwen3-8b", "figures": ["6.1"],
                     "layout": {"check_against": f"outputs/{machine}/ch02"}}
        c = C.PickTheLayout().rule(ev)
        assert c.verdict == claims.HOLDS, c
        assert c.manual_value is None  # the manual gives no number
    ev.params = {"model": "qwen3-8b", "layout": {"check_against": "outputs/nowhere/ch02"}}
    assert C.PickTheLayout().rule(ev).verdict == claims.NOT_MEASURED


# --- on paper -----------------------------------------------------------------------------------
def test_qwen3_8b_fits_one_h200() -> None:
    a = L.pick(L.LayoutInputs(model="qwen3-8b", gpu_memory_gib=H200_GIB, users=32,
                              context_tokens=8192))
    assert a.fits_one_gpu and (a.tp, a.pp, a.dp) == (1, 1, 1)
    assert a.flags == ["--tensor-parallel-size", "1"]
    # the numbers: chapter 2's 144 KiB per token × 32 × 8192 = 36 GiB of KV
    assert a.one_gpu.kv_needed_gib == pytest.approx(36.0)
    assert a.one_gpu.weights_gib == pytest.approx(15.26, abs=0.01)
    assert a.one_gpu.margin_gib > 0


def test_fits_one_gpu_throughput_is_data_parallel() -> None:
    a = L.pick(L.LayoutInputs(model="qwen3-8b", gpu_memory_gib=H200_GIB, gpus_per_node=8,
                              goal="throughput"))
    assert (a.tp, a.pp, a.dp) == (1, 1, 8)
    assert a.flags == ["--tensor-parallel-size", "1", "--data-parallel-size", "8"]


def test_70b_shape_does_not_fit_one_gpu() -> None:
    a = L.pick(big())
    assert not a.fits_one_gpu and not a.fits and a.flags == []
    assert "even all 1 GPU(s)" in a.reasons[-1]


def test_70b_shape_on_8_nvlink_per_goal() -> None:
    lat = L.pick(big(gpus_per_node=8, link="nvlink", goal="latency"))
    assert (lat.tp, lat.pp, lat.dp) == (8, 1, 1)
    thr = L.pick(big(gpus_per_node=8, link="nvlink", goal="throughput"))
    # the fewest GPUs that hold 131 GiB + 40 GiB of KV: TP 2 (~66 GiB each) → 4 replicas
    assert (thr.tp, thr.pp, thr.dp) == (2, 1, 4)
    assert thr.flags == ["--tensor-parallel-size", "2", "--data-parallel-size", "4"]
    # with more users TP 2 no longer holds the KV: TP 4 × DP 2
    more = L.pick(replace(big(gpus_per_node=8, goal="throughput"), users=96))
    assert (more.tp, more.dp) == (4, 2)


def test_two_nodes_of_8_is_tp8_pp2() -> None:
    a = L.pick(replace(big(gpus_per_node=8, nodes=2, link="nvlink"), gpu_memory_gib=80.0,
                       users=64, context_tokens=32768))
    assert (a.tp, a.pp, a.dp) == (8, 2, 1)
    assert a.flags == ["--tensor-parallel-size", "8", "--pipeline-parallel-size", "2"]
    assert any("PP = nodes" in r for r in a.reasons)


def test_pcie_prefers_pipeline_parallelism() -> None:
    a = L.pick(replace(big(gpus_per_node=4, link="pcie"), gpu_memory_gib=80.0, users=8))
    assert a.tp == 1 and a.pp in (2, 3, 4) and a.fits
    assert any("pipeline parallelism instead of tensor" in r for r in a.reasons)
    assert "--pipeline-parallel-size" in a.flags and a.flags[1] == "1"


def test_heads_not_divisible_reject_tp() -> None:
    a = L.pick(big(gpus_per_node=6, link="nvlink"))
    assert any("TP 6 rejected: 64 attention heads do not divide by 6" in r for r in a.reasons)
    assert a.tp in (1, 2, 4)
    ok, rejected = L.tp_sizes(big(), 6)
    assert ok == [1, 2, 4] and rejected
    # 8 KV heads: TP 16 replicates (16 % 8 == 0); a 12-KV-head model refuses TP 8
    odd = {**LLAMA70B, "num_attention_heads": 48, "num_key_value_heads": 12}
    ok, rejected = L.tp_sizes(replace(big(), config=odd), 8)
    assert 8 not in ok and "KV heads" in rejected[0]


def test_uneven_pipeline_split_is_noted() -> None:
    a = L.pick(replace(big(gpus_per_node=4, link="pcie"), gpu_memory_gib=80.0, users=8))
    if 80 % a.pp:
        assert any("unevenly" in r for r in a.reasons)


def test_bad_inputs_are_named() -> None:
    with pytest.raises(L.LayoutError, match="link must be one of"):
        L.pick(L.LayoutInputs(link="infiniband"))  # type: ignore[arg-type]
    with pytest.raises(L.LayoutError, match="users must be a positive integer"):
        L.pick(L.LayoutInputs(users=0))
    with pytest.raises(L.LayoutError, match="unknown layout input"):
        L.inputs_from({"gpus": 8})
    with pytest.raises(L.LayoutError, match="not a preset"):
        L.pick(L.LayoutInputs(model="no-such-model"))


# --- nvidia-smi topo -m ----------------------------------------------------------------------
def test_topology_parser_on_constructed_samples() -> None:
    one = L.parse_topology((TOPO / "h200-1gpu.txt").read_text())
    assert one is not None and one.gpus == 1 and one.link is None
    eight = L.parse_topology((TOPO / "h100-8gpu-nv18.txt").read_text())
    assert eight is not None and eight.gpus == 8 and eight.link == "nvlink"
    assert eight.matrix[(0, 7)] == "NV18" and eight.matrix[(3, 3)] == "X"
    pcie = L.parse_topology((TOPO / "l40s-4gpu-pcie.txt").read_text())
    assert pcie is not None and pcie.gpus == 4 and pcie.link == "pcie"
    pairs = L.parse_topology((TOPO / "a6000-4gpu-nvlink-pairs.txt").read_text())
    assert pairs is not None and pairs.link == "pcie"  # NVLink only in pairs: TP 4 crosses PCIe
    for text in (None, "", "NVIDIA-SMI has failed because it couldn't communicate with the "
                           "NVIDIA driver."):
        assert L.parse_topology(text) is None


def test_on_machine_says_what_was_on_paper() -> None:
    i = L.LayoutInputs(gpus_per_node=8, link="nvlink", gpu_memory_gib=H200_GIB)
    same, paper = L.on_machine(i, {})  # no GPU: everything on paper
    assert same == i and "no GPU here" in paper[0]
    one, paper = L.on_machine(i, {"gpu_topology": (TOPO / "h200-1gpu.txt").read_text(),
                                  "gpu_memory_gib": 140.0})
    assert one.gpus_per_node == 1 and one.gpu_memory_gib == 140.0
    assert "one GPU here" in paper[0]
    eight, paper = L.on_machine(i, {"gpu_topology": (TOPO / "l40s-4gpu-pcie.txt").read_text()})
    assert (eight.gpus_per_node, eight.link, paper) == (4, "pcie", [])


# --- params, plan, form ------------------------------------------------------------------------
def test_ch06_cpu_params_plan_nothing() -> None:
    p = P.load(REPO / "params" / "ch06.yaml")
    assert p.figures_only and p.section(L.SECTION)["check_against"].startswith("outputs/")
    plan = make_plan(p)
    assert plan.engines == [] and plan.runs == []
    assert P.parse(p.to_dict()).to_dict() == p.to_dict()  # round-trips
    assert p.model in PRESETS


def test_ch06_gpu_params_carry_the_layout_beside_fig_6_2s_engines() -> None:
    """On the H200 one file holds both figures: the layout inputs (no engine of their own)
    and Fig 6.2's part (tests/servers/test_disagg.py checks its plan)."""
    p = P.load(REPO / "params" / "ch06-h200.yaml")
    assert not p.figures_only and p.section(L.SECTION)["check_against"] == "outputs/h200/ch02"
    assert [part.name for part in p.parts] == ["disagg"] and p.model in PRESETS
    assert P.parse(p.to_dict()).to_dict() == p.to_dict()  # round-trips


def test_layout_params_errors_name_the_key() -> None:
    base = {"experiment": "x", "model": "qwen3-tiny", "figures_only": True}
    with pytest.raises(P.ParamsError, match=r"layout: .*link must be one of"):
        P.parse({**base, "layout": {"link": "infiniband"}})
    with pytest.raises(P.ParamsError, match=r"layout: unknown layout input"):
        P.parse({**base, "layout": {"gpu": 1}})
    with pytest.raises(P.ParamsError, match=r"layout.machine"):
        P.parse({**base, "layout": {"machine": "maybe"}})
    with pytest.raises(P.ParamsError, match=r"engine_grid: figures_only: true plans no engine"):
        P.parse({**base, "engine_grid": [{}]})


def test_form_values_round_trip() -> None:
    pytest.importorskip("ipywidgets")
    i = L.LayoutInputs(model="qwen3-8b", gpu_memory_gib=H200_GIB, users=32,
                       context_tokens=8192, gpus_per_node=8, goal="throughput")
    f = L.form(i)
    assert f.inputs() == i
    assert f.text == L.answer_markdown(i)
    f.set_values({"model": "qwen1.5-110b", "goal": "latency"})
    want = replace(i, model="qwen1.5-110b", goal="latency")
    assert f.inputs() == want and f.text == L.answer_markdown(want)
    assert "TP 8" in f.text
    shown = {k: i.to_dict()[k] for k in L.FORM_FIELDS}
    f.set_values(shown)
    assert f.inputs() == i and f.values() == shown
    with pytest.raises(L.LayoutError, match="not form fields: dtype"):
        f.set_values({"dtype": "float16"})


@pytest.mark.replot("cpu-ch06")
def test_ch06_notebook_on_stored_rows(replots: dict[str, Replot]) -> None:
    """The committed CPU experiment replots: no engine, 6.1 holds on chapter 2's CPU starts
    and says what it answered on paper; 6.2 points to params/ch06-disagg.yaml."""
    import nbformat

    r = replots["cpu-ch06"]
    rc, out = r.wait()
    assert rc == 0, out
    assert not (r.exp / "engines").exists() and not list((r.exp / "runs").glob("*.json"))
    c = {x["figure"]: x for x in claims.evaluate([r.exp]).to_dict("records")}
    assert c["6.1"]["verdict"] == claims.HOLDS, c["6.1"]
    assert "answered on paper" in c["6.1"]["measured"]
    # on the CPU Fig 6.2 is experiment ch06-disagg (three engine starts): this one says so
    assert c["6.2"]["verdict"] == claims.NOT_MEASURED and "ch06-disagg" in c["6.2"]["why"]
    nb = nbformat.read(sorted((r.exp / "notebooks").glob("*.ipynb"))[-1], as_version=4)
    text = "".join(str(o.get("data", {}).get("text/markdown", "")) for cell in nb.cells
                   for o in cell.get("outputs", []))
    assert "Answered only on paper here:" in text and "--data-parallel-size" in text
    assert not any("error" == o.get("output_type") for cell in nb.cells
                   for o in cell.get("outputs", []))
