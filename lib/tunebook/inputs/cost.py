"""What serving costs, at the price the user states: params `cost:` with the box's price per
hour (`usd_per_hour`) or a GPU's (`usd_per_gpu_hour`, times the GPUs an engine config uses:
tensor × pipeline × data parallel sizes), theirs: tunebook keeps no price list. Each run's row
gets its config's price and USD per million tokens at its measured throughput, and output
tokens per USD: what `search.objective: output_tok_per_usd` maximises (the cheapest tokens that
meet the SLO, which differs from the most tokens when configs use different numbers of GPUs)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tunebook.core.sections import SECTIONS, Checker, Section

KEYS = ("usd_per_hour", "usd_per_gpu_hour")
COLUMNS = ("usd_per_hour", "usd_per_m_output_tok", "usd_per_m_total_tok", "output_tok_per_usd")
GPU_KNOBS = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
OBJECTIVE = "output_tok_per_usd"  # the search objective that needs a price


@dataclass(frozen=True)
class Cost:
    usd_per_hour: float | None = None  # the whole box, whatever a config uses of it
    usd_per_gpu_hour: float | None = None  # one GPU: a config pays for the GPUs it uses

    @property
    def priced(self) -> bool:
        return self.usd_per_hour is not None or self.usd_per_gpu_hour is not None

    def of(self, knobs: Mapping[str, Any]) -> float | None:
        """The price per hour of an engine config with these knobs."""
        if self.usd_per_hour is not None:
            return self.usd_per_hour
        if self.usd_per_gpu_hour is None:
            return None
        gpus = math.prod(int(knobs.get(k) or 1) for k in GPU_KNOBS)
        return self.usd_per_gpu_hour * gpus


class CostSection(Section[Cost]):
    key = "cost"
    default = Cost()

    def read(self, v: Checker, raw: Any) -> Cost:
        if not isinstance(raw, dict):
            v.err(self.key, "must be a mapping: cost: {usd_per_hour: 3.5} (your price of this "
                            "box per hour) or {usd_per_gpu_hour: 2.1}")
            return self.default
        v.unknown(raw, KEYS, self.key)
        given = [k for k in KEYS if k in raw]
        if len(given) != 1:
            v.err(self.key, "needs exactly one of usd_per_hour (the box) and usd_per_gpu_hour "
                            f"(a GPU, times the GPUs each config uses); got {given or 'none'}")
            return self.default
        price = raw[given[0]]
        if isinstance(price, bool) or not isinstance(price, int | float) \
                or not math.isfinite(price) or price <= 0:
            v.err(f"{self.key}.{given[0]}", "must be a positive number: what an hour costs you "
                                            f"in USD, got {price!r}")
            return self.default
        return Cost(**{given[0]: float(price)})

    def dump(self, value: Cost) -> Any:
        return {k: getattr(value, k) for k in KEYS if getattr(value, k) is not None}

    def cross_check(self, v: Checker, data: dict[str, Any], given: bool) -> None:
        search = data.get("search")
        if not given and isinstance(search, dict) and search.get("objective") == OBJECTIVE:
            v.err("search.objective", f"{OBJECTIVE} ranks configs by what their tokens cost: "
                                      "it needs your price, cost: {usd_per_hour: ...} or "
                                      "{usd_per_gpu_hour: ...}")


SECTION = SECTIONS.add(CostSection.key, CostSection())


def per_million(usd_per_hour: float | None, tok_s: Any) -> float | None:
    """USD per million tokens served at `tok_s` tokens/s; None without a price or a rate."""
    if usd_per_hour is None or tok_s is None or isinstance(tok_s, bool):
        return None
    try:
        rate = float(tok_s)
    except (TypeError, ValueError):
        return None
    if not math.isfinite(rate) or rate <= 0:
        return None
    return usd_per_hour / 3600.0 / rate * 1e6


def columns(cost: Cost, knobs: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The row's cost columns for a run of a config with `knobs` and these metrics."""
    price = cost.of(knobs)
    if price is None:
        return {}
    per_m = per_million(price, metrics.get("output_tok_s"))
    out = {"usd_per_hour": price, "usd_per_m_output_tok": per_m,
           "usd_per_m_total_tok": per_million(price, metrics.get("total_tok_s")),
           "output_tok_per_usd": 1e6 / per_m if per_m else None}
    return {k: v for k, v in out.items() if v is not None}
