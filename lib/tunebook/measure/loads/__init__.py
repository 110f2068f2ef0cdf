"""Load kinds: how one load point is sent and read back. `kind_for` is the one place that picks
the kind of a point; measuring code asks it and never names a kind. A new load kind is a module
here with one `LoadKind` class, added to KINDS before the catch-all (vLLM's client).
"""

from __future__ import annotations

from collections.abc import Iterable

from tunebook.inputs.load import LoadPoint
from tunebook.measure.loads.base import LoadKind, Sent
from tunebook.measure.loads.client import VllmClient
from tunebook.measure.loads.probe import BlockReuseProbe
from tunebook.servers.base import ServerOptions

KINDS: tuple[LoadKind, ...] = (BlockReuseProbe(), VllmClient())  # the first that claims wins


def kind_for(point: LoadPoint) -> LoadKind:
    return next(k for k in KINDS if k.claims(point))


def server_options(points: Iterable[LoadPoint]) -> ServerOptions:
    """What an engine must be started with for these points: dev mode when any resets the
    prefix cache, and whatever each point's kind needs."""
    out = ServerOptions()
    for p in points:
        out = out.union(ServerOptions(dev_mode=p.reset_prefix_cache))
        out = out.union(kind_for(p).server_options(p))
    return out


def any_uses_vllm_client(points: Iterable[LoadPoint]) -> bool:
    return any(kind_for(p).uses_vllm_client for p in points)


__all__ = ["KINDS", "LoadKind", "Sent", "any_uses_vllm_client", "kind_for", "server_options"]
