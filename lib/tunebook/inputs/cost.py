"""What serving costs, at the price the user states: params `cost: {usd_per_hour: 3.5}` (the
box's price per hour, theirs: tunebook keeps no price list), turned into USD per million tokens
at each run's measured throughput. A run's row carries the price it was priced at."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tunebook.inputs.sections import SECTIONS, Section
from tunebook.servers.base import Checker

KEYS = ("usd_per_hour",)
COLUMNS = ("usd_per_hour", "usd_per_m_output_tok", "usd_per_m_total_tok")


@dataclass(frozen=True)
class Cost:
    usd_per_hour: float | None = None  # None: not priced


class CostSection(Section[Cost]):
    key = "cost"
    default = Cost()

    def read(self, v: Checker, raw: Any) -> Cost:
        if not isinstance(raw, dict):
            v.err(self.key, "must be a mapping: cost: {usd_per_hour: 3.5} (your price of "
                            "this box per hour)")
            return self.default
        v.unknown(raw, KEYS, self.key)
        price = raw.get("usd_per_hour")
        if isinstance(price, bool) or not isinstance(price, int | float) \
                or not math.isfinite(price) or price <= 0:
            v.err(f"{self.key}.usd_per_hour", "must be a positive number: what an hour of "
                                              f"this box costs you in USD, got {price!r}")
            return self.default
        return Cost(float(price))

    def dump(self, value: Cost) -> Any:
        return {"usd_per_hour": value.usd_per_hour}


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


def columns(cost: Cost, metrics: dict[str, Any]) -> dict[str, Any]:
    """The row's cost columns for a run's metrics (output_tok_s, total_tok_s)."""
    if cost.usd_per_hour is None:
        return {}
    out = {"usd_per_hour": cost.usd_per_hour,
           "usd_per_m_output_tok": per_million(cost.usd_per_hour, metrics.get("output_tok_s")),
           "usd_per_m_total_tok": per_million(cost.usd_per_hour, metrics.get("total_tok_s"))}
    return {k: v for k, v in out.items() if v is not None}
