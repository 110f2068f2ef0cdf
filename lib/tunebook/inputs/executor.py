"""Where a sweep's engine configs run, as a params file says it (`executor:`), checked before any
engine starts: `local` (here, one after the other), `ray` (a local Ray cluster started for the
sweep) or `ray:ADDRESS` (a running one: `auto`, HOST:PORT or ray://HOST:PORT).

tunebook.measure.executors runs them (it sits above params, which reads this section): a new
executor is a value here and a module there. Where a sweep runs is not what it measures: part
of no run id."""

from __future__ import annotations

import re
from typing import Any

from tunebook.core.sections import SECTIONS, Checker, Section, type_name

LOCAL = "local"
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):(?P<port>\d+)")


def ray_address_problem(address: str) -> str | None:
    """Why a Ray cluster address cannot be reached as written (None: `auto`, or HOST:PORT /
    ray://HOST:PORT with a port 1-65535): said before any engine starts, not by ray.init."""
    address = address.strip()
    if address == "auto":
        return None
    m = _RAY_ADDRESS.fullmatch(address)
    if not m:
        return (f"ray:{address!r} is no Ray address: write ray:auto (the cluster this machine "
                "belongs to) or ray:HOST:PORT (e.g. ray:10.0.0.5:6379, ray:ray://head:10001)")
    if not 1 <= int(m["port"]) <= 65535:
        return f"ray:{address}: port {m['port']} is not a port (1-65535)"
    return None


def problem(value: Any) -> str | None:
    """What is wrong with an `executor:` value (None: nothing)."""
    if not isinstance(value, str):
        hint = " (quote it)" if isinstance(value, int | float | bool) else ""
        return f"must be a string{hint}, got {type_name(value)} {value!r}"
    if value in (LOCAL, "ray"):
        return None
    if value.startswith("ray:") and value[4:].strip():
        return ray_address_problem(value[4:])
    return (f"must be 'local', 'ray' (a local Ray cluster) or 'ray:ADDRESS' (e.g. ray:auto), "
            f"got {value!r}")


def ray_address(value: str) -> str | None:
    """The Ray cluster an `executor:` value names ("local": one started here); None: no Ray."""
    if value == LOCAL:
        return None
    return {"ray": "local"}.get(value) or value.removeprefix("ray:")


class ExecutorSection(Section[str]):
    """`executor: local | ray | ray:ADDRESS`."""

    key = "executor"
    default = LOCAL

    def read(self, v: Checker, raw: Any) -> str:
        if raw is None:
            return self.default
        if (why := problem(raw)) is not None:
            v.err(self.key, why)
            return self.default
        return raw

    def dump(self, value: str) -> Any:
        return value

    def cross_check(self, v: Checker, data: dict[str, Any], given: bool) -> None:
        raw, together = data.get(self.key), data.get("start_together")
        if given and raw not in (None, LOCAL) and problem(raw) is None \
                and isinstance(together, int) and not isinstance(together, bool) and together > 1:
            v.err("start_together", "is for engines sharing one machine; on Ray each engine "
                                    "config is its own task on its own GPUs: leave it out")


EXECUTOR = SECTIONS.add(ExecutorSection.key, ExecutorSection())
