"""Chapter 6 — layouts across GPUs and servers: tensor or pipeline parallelism, prefill and
decode on separate servers (Figs 6.1–6.2)."""

from __future__ import annotations

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
    needs = Needs(gpu=True, gpus=2)
