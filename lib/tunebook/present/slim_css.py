"""Drop the CSS rules a static report can never match.

nbconvert's `lab` template inlines JupyterLab's whole stylesheet (~240 KB) into every
report.html: rules for toolbars, menus, widgets, debuggers… that a rendered notebook never
shows. A rule is kept when any of its selectors could match: every class and id the selector
requires (outside functional pseudo-classes such as ``:not(…)``, which are ignored, so a rule
is kept rather than dropped when in doubt) occurs in the page's ``class``/``id`` attributes.
At-rules other than ``@media``/``@supports``/``@layer`` (whose contents are sifted the same
way) are kept whole, as are ``:root`` variables and element selectors. A static page changes
no class after loading (its only scripts are MathJax's config and a module that renders
Mermaid diagrams, which a report does not have), so the page looks the same: checked in
headless Chromium, screenshot for screenshot, by tests/present/test_browser.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_STYLE = re.compile(r"(<style\b[^>]*>)(.*?)(</style>)", re.S | re.I)
_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_CLASS_ATTR = re.compile(r"""\bclass\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)
_ID_ATTR = re.compile(r"""\bid\s*=\s*(?:"([^"]*)"|'([^']*)')""", re.I)
_SIFTED_AT_RULES = ("@media", "@supports", "@layer")
# A class or id a selector requires: `.name` / `#name`, with CSS escapes (`.sm\:flex`).
_NAME = r"(?:\\.|[-\w])+"
_REQUIRED = re.compile(rf"([.#])({_NAME})")


def _page_names(html: str) -> tuple[set[str], set[str]]:
    """The classes and ids the page's markup has (style blocks excluded)."""
    markup = _STYLE.sub("", html)
    classes = {c for m in _CLASS_ATTR.finditer(markup) for c in (m[1] or m[2] or "").split()}
    ids = {m[1] or m[2] or "" for m in _ID_ATTR.finditer(markup)}
    return classes, ids


def _split_top(text: str, sep: str) -> list[str]:
    """`text` split at `sep` outside parentheses, brackets and strings."""
    out, depth, quote, start = [], 0, "", 0
    for i, ch in enumerate(text):
        if quote:
            if ch == quote and text[i - 1] != "\\":
                quote = ""
        elif ch in "\"'":
            quote = ch
        elif ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif ch == sep and depth == 0:
            out.append(text[start:i])
            start = i + 1
    out.append(text[start:])
    return out


def _without_parens(selector: str) -> str:
    """The selector without what parentheses and brackets hold (`:not(.a)`, `[x="y"]`)."""
    out, depth = [], 0
    for ch in selector:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _may_match(selector: str, classes: set[str], ids: set[str]) -> bool:
    for kind, name in _REQUIRED.findall(_without_parens(selector)):
        name = re.sub(r"\\(.)", r"\1", name)
        if name not in (classes if kind == "." else ids):
            return False
    return True


def _string_end(css: str, i: int) -> int:
    """The index just past the CSS string that opens at `i` (a quote; escapes skipped)."""
    j, n = i + 1, len(css)
    while j < n and css[j] != css[i]:
        j += 2 if css[j] == "\\" else 1
    return j + 1


def _blocks(css: str) -> list[tuple[str, str | None]]:
    """Top-level statements: (prelude, body) for `x { body }`, (statement, None) for `@x …;`."""
    out: list[tuple[str, str | None]] = []
    i, n, start = 0, len(css), 0
    while i < n:
        ch = css[i]
        if ch in "\"'":
            i = _string_end(css, i)
            continue
        if ch == ";" and css[start:i].strip().startswith("@"):
            out.append((css[start:i + 1].strip(), None))
            start = i + 1
        elif ch == "{":
            depth, j = 1, i + 1
            while j < n and depth:
                if css[j] in "\"'":
                    j = _string_end(css, j)
                    continue
                if css[j] == "{":
                    depth += 1
                elif css[j] == "}":
                    depth -= 1
                j += 1
            out.append((css[start:i].strip(), css[i + 1:j - 1]))
            i = start = j
            continue
        i += 1
    return out


def _rewrite(css: str, rule: Callable[[str, str], str | None]) -> str:
    """`css` rebuilt statement by statement: each style rule as `rule(prelude, body)` gives it
    (None: dropped); ``@media``/``@supports``/``@layer`` rebuilt inside the same way (dropped
    when nothing is left in them); any other at-rule or statement kept as it is."""
    kept: list[str] = []
    for prelude, body in _blocks(css):
        if body is None:
            kept.append(prelude)
        elif prelude.startswith("@"):
            if prelude.split(None, 1)[0].lower() in _SIFTED_AT_RULES:
                inner = _rewrite(body, rule)
                if inner.strip():
                    kept.append(f"{prelude} {{\n{inner}\n}}")
            else:
                kept.append(f"{prelude} {{{body}}}")
        elif (text := rule(prelude, body)) is not None:
            kept.append(text)
    return "\n".join(kept)


def slim(css: str, classes: set[str], ids: set[str]) -> str:
    """`css` without the rules no element of a page with these classes and ids can match."""
    return _rewrite(_COMMENT.sub("", css), lambda prelude, body: f"{prelude} {{{body}}}" if any(
        _may_match(s, classes, ids) for s in _split_top(prelude, ",")) else None)


_VAR_USE = re.compile(r"var\(\s*(--[-\w]+)")
_VAR_DECL = re.compile(r"\s*(--[-\w]+)\s*:(.*)", re.S)


def _custom_properties(css: str) -> dict[str, list[str]]:
    """Each custom property `css` declares (`--name: value`), with its values."""
    out: dict[str, list[str]] = {}
    for prelude, body in _blocks(css):
        if body is None:
            continue
        if prelude.startswith("@"):
            for k, v in _custom_properties(body).items():
                out.setdefault(k, []).extend(v)
            continue
        for decl in _split_top(body, ";"):
            if m := _VAR_DECL.match(decl):
                out.setdefault(m[1], []).append(m[2])
    return out


def _drop_properties(css: str, unused: set[str]) -> str:
    """`css` without the declarations of the custom properties in `unused` (and without the
    rules left empty by that)."""
    def rule(prelude: str, body: str) -> str | None:
        decls = [d for d in _split_top(body, ";")
                 if not ((m := _VAR_DECL.match(d)) and m[1] in unused)]
        return f"{prelude} {{{';'.join(decls)}}}" if any(d.strip() for d in decls) else None

    return _rewrite(css, rule)


def slim_page(html: str) -> str:
    """The page with each ``<style>`` block slimmed to the rules its markup can match, then to
    the custom properties (``--jp-…``: ~86 KB of icons and theme values) that something kept
    uses through ``var(…)``; unchanged where that would not make it smaller."""
    classes, ids = _page_names(html)
    blocks = [(m[1], slim(m[2], classes, ids), m[3]) for m in _STYLE.finditer(html)]
    declared: dict[str, list[str]] = {}
    for _, css, _ in blocks:
        for k, v in _custom_properties(css).items():
            declared.setdefault(k, []).extend(v)
    # what uses a property: the markup (inline styles), any other declaration, and, through
    # their values, the properties so used (a closure)
    plain = _STYLE.sub("", html) + "".join(
        _drop_properties(css, set(declared)) for _, css, _ in blocks)
    used, todo = set(), set(_VAR_USE.findall(plain))
    while todo:
        name = todo.pop()
        if name not in used:
            used.add(name)
            todo |= {u for v in declared.get(name, []) for u in _VAR_USE.findall(v)}
    unused = set(declared) - used
    it = iter(blocks)

    def one(_: re.Match[str]) -> str:
        start, css, end = next(it)
        return start + _drop_properties(css, unused) + end

    out = _STYLE.sub(one, html)
    return out if len(out) < len(html) else html
