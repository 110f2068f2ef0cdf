"""Reading a params file: `StrictLoader` (plain YAML values only, no duplicate keys, limits on
size, nesting and alias expansion, so a mistaken or hostile file fails in milliseconds), and
the `-p KEY VALUE` overrides applied to it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tunebook.inputs.params.model import (
    MAX_FILE_BYTES,
    MAX_NESTING,
    MAX_VALUES,
    ParamsError,
)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class LoaderProblems(yaml.YAMLError):
    """StrictLoader's refusals, as (dotted key, message) pairs for ParamsError."""

    def __init__(self, problems: list[tuple[str, str]]):
        super().__init__("; ".join(m for _, m in problems))
        self.problems = problems


class StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses what `safe_load` would silently accept.

    - a duplicate mapping key (PyYAML keeps the last value): reported with its dotted path;
    - nesting deeper than MAX_NESTING levels (the composer would hit Python's recursion limit);
    - aliases that expand to more than MAX_VALUES values ("billion laughs"), or that refer to
      themselves. The check walks the composed node graph once, so it costs no more than
      the file's own size however large the expansion would be.
    """

    def __init__(self, stream: Any):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                line = self.peek_event().start_mark.line + 1
                raise LoaderProblems([("", f"YAML is nested more than {MAX_NESTING} levels "
                                            f"deep (line {line}); params need at most 6")])
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_document(self, node: Any) -> Any:
        problems: list[tuple[str, str]] = []
        self._walk(node, "", set(), {}, problems)
        if problems:
            raise LoaderProblems(problems)
        return super().construct_document(node)

    def _key(self, node: Any) -> Any:
        if isinstance(node, yaml.ScalarNode):
            try:
                return self.construct_object(node)  # so `1` and `0x1` are the same key
            except yaml.YAMLError:
                pass
        return (node.tag, id(node))

    def _walk(self, node: Any, path: str, stack: set[int], sizes: dict[int, int],
              problems: list[tuple[str, str]]) -> int:
        """Number of values `node` expands to; records duplicate keys on the way."""
        nid = id(node)
        if nid in stack:
            raise LoaderProblems([(path, "a YAML alias refers to a value that contains it "
                                          "(a recursive structure); params are plain trees")])
        if nid in sizes:  # an alias: already walked (and checked) where its anchor is
            return sizes[nid]
        stack.add(nid)
        size = 1
        if isinstance(node, yaml.SequenceNode):
            for i, child in enumerate(node.value):
                size += self._walk(child, f"{path}[{i}]", stack, sizes, problems)
        elif isinstance(node, yaml.MappingNode):
            first_line: dict[Any, int] = {}
            for key_node, value_node in node.value:
                name = key_node.value if isinstance(key_node, yaml.ScalarNode) else "?"
                child = f"{path}.{name}" if path else str(name)
                if key_node.tag != _MERGE_TAG:
                    key = self._key(key_node)
                    line = key_node.start_mark.line + 1
                    if key in first_line:
                        problems.append((child, f"duplicate key (also on line "
                                                f"{first_line[key]}): YAML would silently keep "
                                                "only the last one; keep one"))
                    else:
                        first_line[key] = line
                size += self._walk(key_node, child, stack, sizes, problems)
                size += self._walk(value_node, child, stack, sizes, problems)
        stack.discard(nid)
        sizes[nid] = size
        if size > MAX_VALUES:
            where = f" at '{path}'" if path else ""
            raise LoaderProblems([("", f"YAML aliases expand to over {MAX_VALUES:,} values"
                                        f"{where} (an alias bomb?); params need a few hundred")])
        return size


def read_yaml(path: Path, source: str) -> Any:
    """The file's YAML data; any problem with the file as a whole is a ParamsError."""
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise ParamsError(source, [("", "file not found")]) from None
    except IsADirectoryError:
        raise ParamsError(source, [("", "is a folder; give a params .yaml file")]) from None
    except OSError as e:
        raise ParamsError(source, [("", f"cannot read: {e.strerror or e}")]) from None
    if len(raw) > MAX_FILE_BYTES:
        raise ParamsError(source, [("", f"file is too large (over {MAX_FILE_BYTES // 1024} KiB);"
                                        " a params file is a few KiB: narrow the sweep")])
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            what = "is UTF-16 text, not UTF-8"
        else:
            line = raw[:e.start].count(b"\n") + 1
            what = f"is not UTF-8 text (byte 0x{raw[e.start]:02x} on line {line})"
        raise ParamsError(source, [("", f"{what}; save it as UTF-8")]) from None
    try:
        return yaml.load(text, Loader=StrictLoader)  # a SafeLoader: plain values only
    except LoaderProblems as e:
        raise ParamsError(source, e.problems) from None
    except yaml.YAMLError as e:
        raise ParamsError(source, [("", yaml_error(e))]) from None


def yaml_error(e: yaml.YAMLError) -> str:
    mark = getattr(e, "problem_mark", None)
    where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else ""
    problem = getattr(e, "problem", None) or str(e).splitlines()[0]
    context = getattr(e, "context", None) or ""
    if isinstance(e, yaml.reader.ReaderError):  # control characters: not a text file
        return (f"YAML syntax error: {str(e).splitlines()[0]} (character {e.position + 1}); "
                "is this a text file?")
    if context.startswith("expected a single document"):
        return (f"YAML syntax error at {where}: a second YAML document ('---'); "
                "put one sweep per file")
    if isinstance(e, yaml.constructor.ConstructorError):
        return (f"YAML tag not allowed at {where}: {problem}; params hold plain values "
                "(strings, numbers, booleans, lists, mappings)")
    context = f" ({context})" if context else ""
    return f"YAML syntax error at {where}: {problem}{context}"


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any], source: str) -> dict:
    """Set dotted keys (`load.users`) in a copy of the raw params mapping."""
    import copy

    data = copy.deepcopy(data)
    for dotted, value in (overrides or {}).items():
        parts = str(dotted).split(".")
        node = data
        for part in parts[:-1]:
            if not isinstance(node.get(part, {}), dict):
                raise ParamsError(source, [(dotted, f"cannot override inside '{part}'")])
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return data


def parse_override(text: str, key: str = "") -> Any:
    """A `-p key value` value: YAML, so `-p load.users [1,2]` gives a list. A value that is
    not YAML is bad params (source `-p`), not a traceback."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.YAMLError as e:
        raise ParamsError("-p", [(key, f"{text!r}: {yaml_error(e)}")]) from None
