"""Fig 3.3's block-reuse probe as a load kind: two token-id prompts sharing a prefix, and the
cached tokens vLLM reports for the second (tunebook.measure.probe sends them)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tunebook.inputs.load import BLOCK_REUSE, LoadPoint
from tunebook.measure import probe
from tunebook.measure.loads.base import LoadKind, Sent
from tunebook.servers.base import Server, ServerOptions

if TYPE_CHECKING:
    from tunebook.inputs.plan import PlannedRun
    from tunebook.measure.context import PointContext


class BlockReuseProbe(LoadKind):
    name = BLOCK_REUSE
    step = "block-reuse probe"

    def claims(self, point: LoadPoint) -> bool:
        return point.dataset == BLOCK_REUSE

    def server_options(self, point: LoadPoint) -> ServerOptions:
        # usage.prompt_tokens_details.cached_tokens is what the probe reads
        return ServerOptions(prompt_tokens_details=True)

    def send(self, server: Server, run: PlannedRun, ctx: PointContext, seed: int | None,
             timings: dict[str, float]) -> Sent:
        vocab = ((ctx.model.config if ctx.model else None) or {}).get("vocab_size")
        found = probe.run(server, run.point, seed if seed is not None else 0,
                          timeout_s=ctx.params.run_timeout_for(run.part), vocab_size=vocab)
        return Sent(found.row, dict(found.record), found.error)
