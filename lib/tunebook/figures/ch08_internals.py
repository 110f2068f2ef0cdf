"""Chapter 8 — inside the engine: processes under tensor parallelism, the step's token
budget, the block pool, speculative verification (Figs 8.1–8.4)."""

from __future__ import annotations

import math

import altair as alt
import pandas as pd

from tunebook import charts
from tunebook.evidence import DIFFERS, HOLDS, NOT_MEASURED, RATIO_TOLERANCE, Claim, Evidence, within
from tunebook.figures.ch04_speculation import (
    COPY_DATASET,
    DUMMY_NOTE,
    acceptance_by_pos,
    frame,
)
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure
from tunebook.manual import result, setting

CHAPTER = chapter(8, "Inside the engine", None,
                  "Processes under tensor parallelism, the token budget of a step, the block "
                  "pool, and how a target pass verifies drafts.")


@figure("8.1")
class ProcessesUnderTp4(FigureUnit):
    title = "Six processes at tensor parallel size 4"
    refs = (
        result("processes_total", 6, "processes", "API server + engine core + GPU workers"),
        result("gpu_worker_processes", 4, "processes", "one GPU worker per GPU"),
        setting("tensor_parallel_size", 4, "GPUs", "--tensor-parallel-size"),
    )
    note = "An architecture figure: process counts, not a performance measurement."
    needs = Needs(gpu=True, gpus=4, knobs=("tensor_parallel_size",))


@figure("8.2")
class StepTokenBudget(FigureUnit):
    title = "Each step spends its token budget"
    refs = (setting("max_num_batched_tokens", 2048, "tokens/step", "token budget of each step"),)
    note = "A scheduler illustration: the budget is a setting, not a measurement."
    needs = Needs(knobs=("max_num_batched_tokens",))


@figure("8.3")
class BlockPool(FigureUnit):
    title = "The KV cache is one pool of blocks"
    refs = (setting("block_size", 16, "tokens/block", "tokens in one KV cache block"),)
    note = "A KV cache illustration: the block size is a setting, not a measurement."
    needs = Needs(knobs=("block_size",))


@figure("8.4")
class TokensPerTargetPass(FigureUnit):
    title = "Tokens per target pass"
    narrative = ("One target pass checks the drafts in order, keeps them up to the first "
                 "rejection and adds one token of its own, so it yields 1 + (accepted drafts) "
                 "tokens. The engine counts drafts, drafted tokens, accepted tokens and accepted "
                 "tokens per position in `/metrics`; each run keeps the difference before and "
                 "after its load. Mean tokens per pass per speculative config, and the "
                 "acceptance curve by position (it can only fall: a later draft counts only if "
                 "every earlier one was accepted). Dummy-weights runs are listed, labelled, and "
                 "never a result.")
    refs = (
        result("tokens_per_target_pass", 1.8, "tokens/pass",
               "tokens one real request got per target pass", "≈"),
    )
    needs = Needs(knobs=("speculative_config",), real_weights=True)

    def table(self, ev: Evidence) -> pd.DataFrame:
        """One row per speculative run: method, depth, prompts, users, drafts, tokens per pass
        (1 + accepted / drafts), acceptance by position, and whether the weights are real."""
        cols = ["engine_label", "spec_method", "spec_depth", "dataset", "users", "drafts",
                "tokens_per_pass", "acceptance_by_pos", "weights"]
        f = frame(ev)
        if f.empty or "spec_drafts" not in f.columns:
            return pd.DataFrame(columns=cols)
        f = f[f.spec_method.notna() & pd.to_numeric(f.spec_drafts, errors="coerce").gt(0)]
        rows = [{"engine_label": r.engine_label, "spec_method": r.spec_method,
                 "spec_depth": int(r.spec_depth), "dataset": r.get("dataset"),
                 "users": int(r.users), "drafts": int(r.spec_drafts),
                 "tokens_per_pass": float(r.spec_tokens_per_pass),
                 "acceptance_by_pos": acceptance_by_pos(r.get("spec_acceptance_by_pos")),
                 "weights": r.weights} for _, r in f.iterrows()]
        return pd.DataFrame(rows, columns=cols)

    def rule(self, ev: Evidence) -> Claim:
        """Real weights only. The mechanism: in every run the acceptance by position never
        rises (drafts are kept up to the first rejection) and tokens per pass = 1 + the sum of
        the per-position acceptance, at most depth + 1. The number: n-gram speculation at
        depth 3 on prompts the answer copies, 1 user (else the first 1-user run) — holds when
        both the mechanism checks and that mean is within 1.25x of the manual's 1.8."""
        t = self.table(ev)
        if t.empty:
            return self.verdict(ev, "no speculative run with drafts", NOT_MEASURED,
                                "needs runs with speculative_config and /metrics counters")
        real = t[t.weights == "real"]
        if real.empty:
            return self.verdict(ev, f"{len(t)} speculative run(s), all on dummy weights",
                                NOT_MEASURED, DUMMY_NOTE)
        broken = []
        for r in real.itertuples():
            p = r.acceptance_by_pos
            rises = any(b > a + 1e-9 for a, b in zip(p, p[1:], strict=False))
            adds = bool(p) and not math.isclose(1 + sum(p), r.tokens_per_pass, rel_tol=1e-6)
            if rises or adds or r.tokens_per_pass > r.spec_depth + 1 + 1e-9:
                broken.append(str(r.engine_label))
        one = real[real.users == 1]
        pick = one[(one.spec_method == "ngram") & (one.spec_depth == 3)
                   & (one.dataset == COPY_DATASET)]
        pick = pick if len(pick) else one if len(one) else real
        r = pick.iloc[0]
        value = float(r.tokens_per_pass)
        ref = self.ref("tokens_per_target_pass").value
        spread = (f"{real.tokens_per_pass.min():.2f}–{real.tokens_per_pass.max():.2f} over "
                  f"{len(real)} real-weights run(s)")
        measured = (f"{value:.2f} tokens/pass ({r.spec_method} x{r.spec_depth}, {r.dataset}, "
                    f"{r.users} user(s)); {spread}")
        if len(t) > len(real):
            measured += f"; {len(t) - len(real)} dummy-weights run(s) left out ({DUMMY_NOTE})"
        mech = ("acceptance never rose with position and tokens per pass = 1 + its sum in "
                "every run" if not broken else f"the counters break the mechanism in {broken}")
        # vLLM counts a draft only for a request that had draft tokens in that pass (n-gram
        # proposes nothing where nothing matches): its mean is over passes that drafted.
        mech += " (vLLM's counters average over the passes that drafted)"
        holds = not broken and within(value, ref)
        why = (f"{mech}; {value:.2f} is within {RATIO_TOLERANCE:.2f}x of the manual's {ref:g}"
               if holds else f"{mech}; {value:.2f} vs the manual's {ref:g}" +
               ("" if within(value, ref) else f" (not within {RATIO_TOLERANCE:.2f}x: tokens "
                                              "per pass is the acceptance of this drafter on "
                                              "this text)"))
        return self.verdict(ev, measured, HOLDS if holds else DIFFERS, why, value, ref)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin | None:
        t = self.table(ev)
        if t.empty:
            return None
        t = t.assign(config=[f"{charts.display_label(lbl)} · {ds} · {u} user(s)"
                             + ("" if w == "real" else " · DUMMY WEIGHTS")
                             for lbl, ds, u, w in zip(t.engine_label, t.dataset, t.users,
                                                      t.weights, strict=True)])
        # the curve at one user only: one line per speculative config stays readable
        pos = pd.DataFrame([{"config": r.config, "position": i + 1, "accepted": a,
                             "weights": "real" if r.weights == "real" else "dummy"}
                            for r in t.itertuples() if r.users == t.users.min()
                            for i, a in enumerate(r.acceptance_by_pos)])
        ref = self.ref("tokens_per_target_pass").value
        bars = (alt.Chart(t).mark_bar().encode(
            x=alt.X("tokens_per_pass:Q", title="mean tokens per target pass"),
            y=alt.Y("config:N", title=None, sort="-x", axis=alt.Axis(labelLimit=360)),
            color=alt.Color("weights:N", scale=alt.Scale(
                domain=["real", DUMMY_NOTE], range=[charts.PALETTE[0], charts.REFERENCE_FILL])),
            tooltip=["config", "drafts", alt.Tooltip("tokens_per_pass:Q", format=".2f")])
            + alt.Chart(pd.DataFrame({"x": [ref]})).mark_rule(strokeDash=[4, 4]).encode(x="x:Q")
        ).properties(width=360, title=charts.titled(
            "Tokens per target pass, from the engine's counters",
            [f"dashed: the manual's ≈{ref:g} (one real request)"]))
        if pos.empty:
            return charts.beside(bars, self.reference_panel())
        curve = alt.Chart(pos).mark_line(point=True).encode(
            x=alt.X("position:O", title="draft position"),
            y=alt.Y("accepted:Q", title="drafts accepted up to here", axis=alt.Axis(
                format="%")),
            color=alt.Color("config:N", legend=alt.Legend(labelLimit=360)),
            strokeDash=alt.StrokeDash("weights:N", scale=alt.Scale(
                domain=["real", "dummy"], range=[[1, 0], [4, 4]])),
            tooltip=["config", "position", alt.Tooltip("accepted:Q", format=".1%")],
        ).properties(width=360, height=200, title=charts.titled(
            "Acceptance by position", [f"{int(t.users.min())} user(s); dashed: dummy weights"]))
        return charts.ratio_first(bars, curve, self.reference_panel())
