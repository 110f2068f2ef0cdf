"""EngineKeeper (the tuning panel's kept engine, the test suite's shared one): a replacement
engine starts with the options of the engines it replaces, so a later sweep that needed them
does not pay for another start."""

from __future__ import annotations

from pathlib import Path

from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.measure.supply import EngineKeeper
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.models.presets import resolve_model
from tunebook.servers.base import ServerOptions


class Dead:
    def __init__(self, options: ServerOptions) -> None:
        self.options, self.up, self.stops = options, True, 0

    def alive(self) -> bool:
        return self.up

    def stop(self) -> None:
        self.up, self.stops = False, self.stops + 1


def _params() -> P.SweepParams:
    return P.parse({"experiment": "keep", "model": "qwen3-tiny",
                    "engine": {"max_model_len": 1024},
                    "load": {"users": [1], "reset_prefix_cache": False}})


def test_a_replacement_keeps_the_options_of_the_engine_it_replaces(tmp_path: Path) -> None:
    params = _params()
    cfg = make_plan(params).engines[0]
    keeper = EngineKeeper()
    full = ServerOptions(dev_mode=True, prompt_tokens_details=True)
    first = Dead(full)
    keeper.keep(cfg, first)  # type: ignore[arg-type]
    first.up = False  # killed
    assert keeper.take(cfg, ServerOptions()) is None and first.stops == 1
    # this sweep's runs need no option; its fresh engine still gets the killed one's
    sweep = Sweep(params, tmp_path, SweepOptions(progress=False, keeper=keeper))
    supply = sweep.local_executor().supply
    fresh = supply.new(cfg, resolve_model("qwen3-tiny"), supply.options_for(cfg, sweep.plan.runs))
    assert fresh.options == full
    assert keeper.widen(cfg, ServerOptions()) == full
    # without a keeper (a one-off sweep), an engine gets what its runs need and no more
    alone = Sweep(params, tmp_path, SweepOptions(progress=False))
    assert alone.local_executor().supply.options_for(cfg, alone.plan.runs) == ServerOptions()
    # another config starts from its own runs' needs
    other = make_plan(P.parse({**params.to_dict(), "engine": {"max_model_len": 512}})).engines[0]
    assert other.id != cfg.id
    assert keeper.widen(other, ServerOptions(dev_mode=True)) == ServerOptions(dev_mode=True)
