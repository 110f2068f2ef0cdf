"""A params section owned by its mechanism: the mechanism declares its top-level key, reads and
checks it, and writes it back; params asks every registered section (SECTIONS) instead of
knowing each one. A new section is one class next to the code that uses it, registered here
with `SECTIONS.add`, and imported by tunebook.inputs.params (the owners' list). The base lives
in core so that an owner on any floor below params can declare one (the launcher's
`fast_start`, in servers; the price, `cost`, in inputs).

A section is how something is measured or priced, never what: no section enters a run id."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar

from tunebook.core.registry import Registry

T = TypeVar("T")


def type_name(x: Any) -> str:
    """A YAML value's type as a problem says it ("got a list [...]")."""
    return {dict: "a mapping", list: "a list", str: "a string", bool: "a boolean",
            int: "an integer", float: "a number",
            type(None): "nothing (null)"}.get(type(x), type(x).__name__)


class Checker(Protocol):
    """What tunebook.inputs.params' validator offers code that checks its own part of params
    (a section, a server kind): params asks them; they never import params."""

    def err(self, key: str, msg: str) -> None: ...

    def knobs(self, data: dict, prefix: str, types: bool = True) -> dict[str, Any]: ...

    def unknown(self, data: dict, allowed: Any, prefix: str) -> None: ...


class Section(ABC, Generic[T]):
    key: str = ""  # the top-level params key
    default: T

    @abstractmethod
    def read(self, v: Checker, raw: Any) -> T:
        """The section's value from its raw YAML, every problem said through `v.err` (with
        keys under `self.key`); return the default where it is unusable."""

    @abstractmethod
    def dump(self, value: T) -> Any:
        """The value as YAML-able data (`read` reads it back)."""

    def cross_check(self, v: Checker, data: dict[str, Any], given: bool) -> None:
        """Rules between this section and the rest of the file (`given`: whether the file
        has this section), said through `v.err`; run for every registered section."""

    def check_with_load(self, v: Checker, value: T, load: Any) -> None:
        """Rules that need the parsed load (tunebook.inputs.params.LoadParams, None where the
        file's load is unusable: e.g. its levels), said through `v.err`; run for the sections
        the file has."""


SECTIONS: Registry[Section[Any]] = Registry("params section")
