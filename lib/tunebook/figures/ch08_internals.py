"""Chapter 8 — inside the engine: processes under tensor parallelism, the step's token
budget, the block pool, speculative verification (Figs 8.1–8.4)."""

from __future__ import annotations

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
    refs = (
        result("tokens_per_target_pass", 1.8, "tokens/pass",
               "tokens one real request got per target pass", "≈"),
    )
    needs = Needs(knobs=("speculative_config",), real_weights=True)
