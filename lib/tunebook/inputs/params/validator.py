"""The validator every check writes to: each problem a (dotted key, message) pair, all of them
said at once as one ParamsError."""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

from tunebook.core import knobs
from tunebook.core.knobs import short
from tunebook.core.sections import type_name
from tunebook.inputs.params.model import (
    ParamsError,
)


def knob_problem(k: str, val: Any) -> str | None:
    """What is wrong with engine knob `k` set to `val` (None = vLLM's default is fine)."""
    knob = knobs.KNOBS[k]
    if knob.accepts(val):
        return None
    return f"must be {knob.allowed}, got {type_name(val)} {short(val)}"


class Validator:
    """Collects (key, message) problems so one error reports them all."""

    def __init__(self, source: str):
        self.source = source
        self.problems: list[tuple[str, str]] = []

    def err(self, key: str, msg: str) -> None:
        self.problems.append((key, msg))

    def raise_if_any(self) -> None:
        if self.problems:
            raise ParamsError(self.source, self.problems)

    def unknown(self, data: dict, allowed: Collection[str], prefix: str) -> None:
        for k in data:
            if k not in allowed:
                where = f"{prefix}.{k}" if prefix else str(k)
                self.err(where, f"unknown key{knobs.did_you_mean(k, allowed)}; "
                                f"allowed: {', '.join(allowed)}")

    def get(self, data: dict, key: str, typ: type, required: bool = False, default: Any = None,
            prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            if required:
                self.err(where, "is required")
            return default
        val = data[key]
        if not isinstance(val, typ) or (typ is not bool and isinstance(val, bool)):
            hint = " (quote it)" if typ is str and isinstance(val, int | float | bool) else ""
            self.err(where, f"must be {type_name(typ())}{hint}, got {type_name(val)} {short(val)}")
            return default
        return val

    def number(self, data: dict, key: str, typ: Any, default: Any, lo: float,
               prefix: str = "") -> Any:
        where = f"{prefix}.{key}" if prefix else key
        if key not in data or data[key] is None:
            return default
        val = data[key]
        want = "an integer" if typ is int else "a number"
        if isinstance(val, bool) or not isinstance(val, typ) \
                or (isinstance(val, float) and math.isnan(val)):
            self.err(where, f"must be {want} >= {lo:g}, got {type_name(val)} {short(val)}")
            return default
        if val < lo:
            self.err(where, f"must be {want} >= {lo:g}, got {val!r}")
            return default
        return val

    def knobs(self, data: dict, prefix: str, types: bool = True) -> dict[str, Any]:
        self.unknown(data, knobs.KNOBS, prefix)
        out = {}
        for k, val in data.items():
            if k not in knobs.KNOBS:
                continue
            problem = knob_problem(k, val) if types else None
            if problem:
                self.err(f"{prefix}.{k}", problem)
            else:
                out[k] = val
        return out
