"""EngineKeeper (the tuning panel's kept engine, the test suite's shared one): a replacement
engine starts with the options of the engines it replaces, so a later sweep that needed them
does not pay for another start."""

from __future__ import annotations

from pathlib import Path

from tunebook import params as P
from tunebook.engine import ServerOptions
from tunebook.models import resolve_model
from tunebook.plan import make_plan
from tunebook.sweep import EngineKeeper, Sweep


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
    sweep = Sweep(params, tmp_path, progress=False, keeper=keeper)
    fresh = sweep._engine(cfg, sweep.plan.runs, resolve_model("qwen3-tiny"))
    assert fresh.options == full
    assert keeper.widen(cfg, ServerOptions()) == full
    # without a keeper (a one-off sweep), an engine gets what its runs need and no more
    alone = Sweep(params, tmp_path, progress=False)
    assert alone._engine(cfg, alone.plan.runs, resolve_model("qwen3-tiny")).options == \
        ServerOptions()
    # another config starts from its own runs' needs
    other = make_plan(P.parse({**params.to_dict(), "engine": {"max_model_len": 512}})).engines[0]
    assert other.id != cfg.id
    assert keeper.widen(other, ServerOptions(dev_mode=True)) == ServerOptions(dev_mode=True)
