"""Prompt sets for n-gram speculation (Fig 4.2), built offline from Python's standard library.

n-gram speculation drafts the tokens that followed the last few tokens where they occurred
earlier in the context, so it only pays when the answer copies long stretches of the prompt.
Each prompt set pairs one instruction with the source of a standard-library function:

    code_edit           the answer repeats the code: rewrite it unchanged, adding one comment
    code_edit_rename    the answer repeats the code with one parameter renamed
    code_edit_verbatim  the naive "repeat this code" (a first look found acceptance low on it)
    fresh_text          the answer does not repeat the code: explain it in plain words

Every set holds the same functions with instructions of similar length, so prompt lengths (and
so TPOT) compare fairly across sets. A set is written as a vLLM ``custom`` dataset (JSONL, one
``{"prompt": ...}`` per line; vLLM's client applies the model's chat template to it and sends it
to /v1/completions) into ``<model cache>/prompts/``, named by its content digest, so a file is
never rewritten and a run that used it can be traced back to it.

The functions come from the running Python's own sources, which differ between versions (3.11
on the CPU machine, 3.12 on the H200): only the functions listed in data/prompt_functions.json
are offered, those whose code was identical in both, so the two machines send the same prompts.
Every record also carries the module, source file, function name, the sha256 of its code and
the Python version, so any two files can be compared function by function.
Which functions fit a load point depends on the tokenizer: a function is kept when every set's
prompt for it is at most ``input_len`` tokens (so ``input_len + output_len`` still bounds each
request, as for vLLM's random dataset) and its code is at least ``output_len`` tokens long (so
``--ignore-eos`` does not push a faithful copy past its end).

``ngram_replay`` replays vLLM's n-gram proposer over a greedy answer, to tell offline from plain
generations how much a template would let speculation accept (greedy output is the same with and
without speculation).
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import json
import platform
import sysconfig
import textwrap
import tokenize
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunebook.core import config
from tunebook.core.files import replace_atomic

GENERATOR = "tunebook.models.prompts/2"  # bump when the selection or the templates change
KINDS = ("code_edit", "fresh_text")

# Pure-Python standard-library modules present in 3.11 and 3.12, read as text (never imported).
SOURCE_MODULES = (
    "argparse", "base64", "bisect", "calendar", "configparser", "csv", "dataclasses",
    "difflib", "email/utils", "fnmatch", "fractions", "ftplib", "functools", "gettext", "glob",
    "gzip", "heapq", "html/__init__", "inspect", "ipaddress", "json/decoder", "json/encoder",
    "locale", "mimetypes", "netrc", "ntpath", "optparse", "pathlib", "platform", "posixpath",
    "pprint", "quopri", "shlex", "shutil", "smtplib", "statistics", "string", "tabnanny",
    "tarfile", "textwrap", "tokenize", "traceback", "urllib/parse", "uu", "uuid", "wave",
    "zipfile", "zipfile/__init__",  # a package from 3.12 on
)
# The functions offered: those whose text was the same in the Pythons this file lists (the CPU
# machine's and the H200's), as (module, function, sha256 of the code), so both machines send
# the same prompts. Another Python offers the listed functions it still has unchanged.
PINNED_FILE = "prompt_functions.json"
MIN_LINES, MAX_LINES = 15, 60  # a function's lines, its def line to its last line
MAX_LINE_CHARS = 100
MIN_RECORDS = 8  # fewer fitting functions than this is an error, not a thin data set
# A floor on load.input_len for these sets (params checks it before any engine starts): the
# shortest prompt, a 15-line function with its instruction in a chat template, is ~200 tokens.
MIN_INPUT_LEN = 256


@dataclass(frozen=True)
class PromptSet:
    name: str
    kind: str  # one of KINDS
    template: str  # str.format fields: code; old and new (a parameter's rename)
    about: str


PROMPT_SETS: dict[str, PromptSet] = {s.name: s for s in (
    PromptSet("code_edit", "code_edit",
              "Here is a Python function.\n\n```python\n{code}\n```\n\nWrite the same function "
              "again, unchanged, with one comment line above it that says what it does.",
              "rewrite unchanged with a comment line above"),
    PromptSet("code_edit_rename", "code_edit",
              "Here is a Python function.\n\n```python\n{code}\n```\n\nWrite the same function "
              "again with the parameter `{old}` renamed to `{new}`. Change nothing else.",
              "rewrite with one parameter renamed"),
    PromptSet("code_edit_verbatim", "code_edit",
              "Repeat this code:\n\n```python\n{code}\n```",
              "the naive 'repeat this code'"),
    PromptSet("fresh_text", "fresh_text",
              "Here is a Python function.\n\n```python\n{code}\n```\n\nExplain in plain English "
              "what it does and when you would use it. Do not repeat the code.",
              "explain in own words; the answer does not repeat the code"),
)}


class PromptsError(ValueError):
    """A prompt set cannot be built for this tokenizer and these lengths."""


@dataclass(frozen=True)
class Snippet:
    """One standard-library function, dedented, without its decorators."""

    module: str  # e.g. json.decoder
    source_file: str  # relative to the standard library folder, e.g. json/decoder.py
    function: str  # qualified name, e.g. JSONDecoder.raw_decode
    code: str
    old: str  # a parameter used at least twice in the body (code_edit_rename renames it)
    new: str

    @property
    def lines(self) -> int:
        return self.code.count("\n") + 1

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.code.encode()).hexdigest()

    def renamed(self) -> str:
        """The code with parameter ``old`` renamed to ``new`` (names only, not strings)."""
        lines = self.code.split("\n")
        hits = [t.start for t in tokenize.generate_tokens(io.StringIO(self.code).readline)
                if t.type == tokenize.NAME and t.string == self.old]
        for row, col in reversed(hits):  # right to left: earlier columns stay valid
            line = lines[row - 1]
            lines[row - 1] = line[:col] + self.new + line[col + len(self.old):]
        return "\n".join(lines)


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _functions(tree: ast.Module) -> list[tuple[str, ast.FunctionDef]]:
    """Module-level functions and methods of module-level classes, with qualified names."""
    out: list[tuple[str, ast.FunctionDef]] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            out.append((node.name, node))
        elif isinstance(node, ast.ClassDef):
            out += [(f"{node.name}.{m.name}", m) for m in node.body
                    if isinstance(m, ast.FunctionDef)]
    return out


def _rename_target(fn: ast.FunctionDef, code: str) -> tuple[str, str] | None:
    """The parameter read most often in the body (ties: the first), renamed to <name>_value."""
    args = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)
            if a.arg not in ("self", "cls") and len(a.arg) >= 3]
    uses = {a: 0 for a in args}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and node.id in uses:
            uses[node.id] += 1
    best = max(args, key=lambda a: uses[a], default=None)
    if best is None or uses[best] < 2 or f"{best}_value" in code:
        return None
    return best, f"{best}_value"


def _usable(code: str) -> bool:
    lines = code.split("\n")
    # starts at column 0 (a string less indented than its method would keep dedent from it)
    return (code.startswith("def ") and MIN_LINES <= len(lines) <= MAX_LINES
            and code.isascii() and "\t" not in code
            and "```" not in code and max(map(len, lines)) <= MAX_LINE_CHARS)


def pinned_functions() -> set[tuple[str, str, str]]:
    data = json.loads(config.package_data(PINNED_FILE).read_text(encoding="utf-8"))
    return {(m, f, sha) for m, f, sha in data["functions"]}


@functools.lru_cache(maxsize=4)
def stdlib_snippets(root: Path | None = None, pinned: bool = True) -> tuple[Snippet, ...]:
    """The usable functions of SOURCE_MODULES (only the pinned ones unless ``pinned`` is
    false), in an order fixed by their names alone (the sha256 of "module:function"), so the
    same function sorts the same on every Python."""
    root = root or stdlib_dir()
    keep = pinned_functions() if pinned else None
    found: list[Snippet] = []
    for mod in SOURCE_MODULES:
        path = root / f"{mod}.py"
        if not path.is_file():  # gone in this Python: its functions are simply not offered
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.split("\n")
        module = mod.removesuffix("/__init__").replace("/", ".")
        for name, fn in _functions(ast.parse(text)):
            code = textwrap.dedent("\n".join(lines[fn.lineno - 1:fn.end_lineno]))
            if not _usable(code):
                continue
            target = _rename_target(fn, code)
            if target is None:
                continue
            snip = Snippet(module, path.relative_to(root).as_posix(), name, code, *target)
            if keep is None or (module, name, snip.sha256) in keep:
                found.append(snip)
    return tuple(sorted(found, key=lambda s: hashlib.sha256(
        f"{s.module}:{s.function}".encode()).hexdigest()))


def snippet_ids(pinned: bool = False) -> list[list[str]]:
    """[module, function, sha256] of this Python's usable functions: intersect two machines'
    lists to renew PINNED_FILE."""
    return [[s.module, s.function, s.sha256] for s in stdlib_snippets(pinned=pinned)]


def user_message(prompt_set: PromptSet, snippet: Snippet) -> str:
    return prompt_set.template.format(code=snippet.code, old=snippet.old, new=snippet.new)


def reference_answer(prompt_set: PromptSet, snippet: Snippet) -> str | None:
    """What a faithful answer repeats (code_edit sets), or None (fresh_text)."""
    if prompt_set.kind != "code_edit":
        return None
    return snippet.renamed() if "{old}" in prompt_set.template else snippet.code


# Chat-templated token counts per tokenizer (each set's prompts are counted for every set's
# build, so that all sets keep the same functions).
_COUNTS: weakref.WeakKeyDictionary[Any, dict[str, int]] = weakref.WeakKeyDictionary()


def _token_counter(tokenizer: Any) -> tuple[Callable[[str], int], Callable[[str], int]]:
    """(prompt tokens as vLLM's client counts them: chat template applied, then tokenized;
    plain tokens of a text)."""
    if isinstance(tokenizer, str | Path):
        tokenizer = _load_tokenizer(str(tokenizer))
    try:
        memo = _COUNTS.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that takes no weak reference: count every time
        memo = {}

    def prompt_tokens(message: str) -> int:
        if message in memo:
            return memo[message]
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": message}],
                                                 add_generation_prompt=True, tokenize=False)
        except ValueError as e:  # no chat template: vLLM's client would fail the same way
            raise PromptsError(f"the tokenizer has no chat template, which vLLM's custom "
                               f"dataset applies to every prompt: {e}") from e
        memo[message] = len(tokenizer(text).input_ids)
        return memo[message]

    def text_tokens(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False).input_ids)

    return prompt_tokens, text_tokens


def build_records(name: str, tokenizer: Any, max_prompt_tokens: int,
                  min_answer_tokens: int, snippets: Sequence[Snippet] | None = None
                  ) -> list[dict[str, Any]]:
    """The records of prompt set ``name``: one per function whose prompt in EVERY set is at
    most ``max_prompt_tokens`` and whose code is at least ``min_answer_tokens`` long."""
    if name not in PROMPT_SETS:
        raise PromptsError(f"unknown prompt set {name!r}; known: {', '.join(PROMPT_SETS)}")
    snippets = stdlib_snippets() if snippets is None else snippets
    prompt_tokens, text_tokens = _token_counter(tokenizer)
    python = platform.python_version()
    records: list[dict[str, Any]] = []
    for snip in snippets:
        answer_tokens = text_tokens(snip.code)
        if answer_tokens < min_answer_tokens:
            continue
        n_tokens = {s: prompt_tokens(user_message(p, snip)) for s, p in PROMPT_SETS.items()}
        if max(n_tokens.values()) > max_prompt_tokens:
            continue
        pset = PROMPT_SETS[name]
        records.append({
            "prompt": user_message(pset, snip),
            "set": name, "kind": pset.kind,
            "prompt_tokens": n_tokens[name],  # with the chat template, as vLLM's client counts
            "code_tokens": answer_tokens,
            "module": snip.module, "source_file": snip.source_file, "function": snip.function,
            "lines": snip.lines, "source_sha256": snip.sha256,
            "rename_from": snip.old if "{old}" in pset.template else None,
            "rename_to": snip.new if "{old}" in pset.template else None,
            "reference": reference_answer(pset, snip),
            "python": python, "generator": GENERATOR,
        })
    if len(records) < MIN_RECORDS:
        pythons = json.loads(config.package_data(PINNED_FILE).read_text())["pythons"]
        other = ("" if python in pythons else f" (Python {python} is none of the pinned "
                 f"list's {', '.join(pythons)}: fewer of its functions are unchanged)")
        raise PromptsError(
            f"prompt set {name!r}: only {len(records)} of {len(snippets)} standard-library "
            f"functions{other} fit prompts <= {max_prompt_tokens} tokens (load.input_len) "
            f"with code >= {min_answer_tokens} tokens (load.output_len); {MIN_RECORDS} "
            "needed: raise input_len or lower output_len")
    return records


def prompts_dir(root: Path | None = None) -> Path:
    return (root or config.model_cache_dir()) / "prompts"


def write_records(name: str, records: list[dict[str, Any]], root: Path | None = None) -> Path:
    """Writes (once) a JSONL file named by its content; an existing one is reused as is."""
    text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = prompts_dir(root)
    folder.mkdir(parents=True, exist_ok=True)
    major, minor = platform.python_version_tuple()[:2]
    path = folder / f"{name}-py{major}{minor}-{digest}.jsonl"  # vLLM reads only *.jsonl
    if path.is_file():
        return path
    # atomic: a reader never sees a partial file; 0644 whatever the umask: engines may run as
    # another user
    return replace_atomic(path, text.encode("utf-8"), mode=0o644)


def dataset_file(name: str, tokenizer: Any, max_prompt_tokens: int, min_answer_tokens: int,
                 root: Path | None = None) -> Path:
    """The JSONL file of prompt set ``name`` for this tokenizer and these lengths. With a
    tokenizer given by its path or id, the records are built once per process (a sweep asks
    again for every load point)."""
    if isinstance(tokenizer, str | Path):
        records = _records_for(name, str(tokenizer), max_prompt_tokens, min_answer_tokens)
        return write_records(name, json.loads(records), root)
    return write_records(name, build_records(name, tokenizer, max_prompt_tokens,
                                             min_answer_tokens), root)


@functools.lru_cache(maxsize=32)
def _records_for(name: str, tokenizer: str, max_prompt_tokens: int,
                 min_answer_tokens: int) -> str:
    return json.dumps(build_records(name, _load_tokenizer(tokenizer), max_prompt_tokens,
                                    min_answer_tokens))


@functools.lru_cache(maxsize=4)
def _load_tokenizer(path_or_id: str) -> Any:
    from transformers import AutoTokenizer  # late: heavy, and only needed here

    return AutoTokenizer.from_pretrained(path_or_id)


# ---------------------------------------------------------------------------------------------
# Replaying vLLM's n-gram proposer over a finished greedy answer.


def ngram_propose(context: Sequence[int], k: int, min_n: int, max_n: int) -> list[int]:
    """vLLM's n-gram draft (v1/spec_decode/ngram_proposer.py): the longest suffix of
    ``context`` of ``min_n`` to ``max_n`` tokens that also occurs earlier (its first
    occurrence), and up to ``k`` tokens that followed it."""
    total = len(context)
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        suffix = list(context[total - n:])
        for start in range(total - n):
            if list(context[start:start + n]) == suffix:
                return list(context[start + n:start + n + k])
    return []


def ngram_replay(prompt_ids: Sequence[int], output_ids: Sequence[int], k: int,
                 min_n: int = 5, max_n: int = 5) -> dict[str, Any]:
    """What n-gram speculation with ``k`` draft tokens would draft and accept on this greedy
    answer. Counts as vLLM's spec-decode counters do: ``drafts`` (verification steps that had a
    draft), ``draft_tokens``, ``accepted_tokens`` and ``accepted_per_position``; plus
    ``target_passes`` (decode steps after the first token) and the derived rates. The prefill's
    token comes first, then each step drafts from prompt + answer so far, accepts the longest
    matching prefix of the draft and adds the target's own next token."""
    context = list(prompt_ids)
    out = list(output_ids)
    pos = min(1, len(out))
    drafts = draft_tokens = accepted = passes = 0
    per_position = [0] * k
    while pos < len(out):
        draft = ngram_propose(context + out[:pos], k, min_n, max_n)
        hit = 0
        while hit < len(draft) and pos + hit < len(out) and draft[hit] == out[pos + hit]:
            per_position[hit] += 1
            hit += 1
        if draft:
            drafts += 1
            draft_tokens += len(draft)
            accepted += hit
        passes += 1
        pos += hit + 1
    return {
        "k": k, "min_n": min_n, "max_n": max_n, "output_tokens": len(out),
        "drafts": drafts, "draft_tokens": draft_tokens, "accepted_tokens": accepted,
        "accepted_per_position": per_position, "target_passes": passes,
        "acceptance": accepted / draft_tokens if draft_tokens else None,
        "tokens_per_pass": (len(out) - min(1, len(out))) / passes if passes else None,
    }
