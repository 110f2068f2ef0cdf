"""The package's shape: folders in pipeline order with every arrow pointing down, seams instead
of flags in the measuring code, and constructors that take few arguments.

- Layers: a module imports only from its own folder or a folder below it in LAYERS (late
  imports inside functions count; `if TYPE_CHECKING:` ones do not: they never run). Data flows
  one way: core -> models -> servers -> inputs -> results -> measure -> search -> charts ->
  figures -> present -> commands -> the command line.
- Seams: nothing under measure/ names a server class or asks a config which kind it is; one
  place (tunebook.servers.kinds.server_for) picks the server, and the Server protocol is all
  the measuring code knows.
- Constructors: no `__init__` in lib/tunebook takes more than 6 parameters besides self
  (options are grouped in a dataclass).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from test_imports import PKG, graph, modules

LAYERS = ("core", "models", "servers", "inputs", "results", "measure", "search", "charts",
          "figures", "present", "commands", "")  # "": the package's own top level (cli, vllm_hooks)
MAX_INIT_PARAMS = 6
# what would let measuring code branch on a server's kind
SERVER_MODULES = {"tunebook.servers.vllm", "tunebook.servers.sglang", "tunebook.servers.disagg",
                  "tunebook.servers.process"}
KIND_CLASS = re.compile(r"\b(Engine|DisaggPair|SGLangServer|ProcessServer|Server)\b")
KIND_OBJECT = re.compile(r"(engine|server|pair)", re.I)
SERVER_NAMES = {"Engine", "SGLangServer", "DisaggPair", "ProcessServer", "is_pair", "kind_of",
                "VLLM", "SGLANG"}


def folder(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in LAYERS) else ""


def rank(module: str) -> int:
    return LAYERS.index(folder(module))


def test_every_module_lives_in_a_known_folder() -> None:
    stray = [m for m in modules() if folder(m) not in LAYERS]
    assert not stray, f"modules outside the layers {LAYERS}: {stray}"
    top = sorted(m for m in modules() if folder(m) == "" and m != "tunebook")
    # the command line, and the scheduler vLLM imports by the dotted path params files name
    assert top == ["tunebook.cli", "tunebook.vllm_hooks"], top


def test_no_arrow_runs_back_up() -> None:
    g = graph()
    up = [f"{a} imports {b} (line {line}): {folder(a) or 'top'} is below {folder(b) or 'top'}"
          for a, targets in g.items() for b, line in targets.items() if rank(b) > rank(a)]
    assert not up, "imports that run back up the pipeline:\n  " + "\n  ".join(up)


def _server_kind_names(path: Path) -> set[str]:
    """Names of server kinds a module uses, and server modules it imports."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in SERVER_NAMES:
            out.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in SERVER_NAMES:
            out.add(node.attr)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.update(f"{node.module}.{a.name}" for a in node.names
                       if f"{node.module}.{a.name}" in SERVER_MODULES)
            if node.module in SERVER_MODULES:
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in SERVER_MODULES)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance":
            if KIND_CLASS.search(ast.unparse(node.args[1])):  # isinstance(x, DisaggPair)
                out.add(ast.unparse(node))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr",
                                                                             "hasattr"):
            if KIND_OBJECT.search(ast.unparse(node.args[0])):  # getattr(engine, "phases")
                out.add(ast.unparse(node))
    return out


def test_the_measuring_code_knows_servers_only_through_their_protocol() -> None:
    measuring = [p for m, p in modules().items() if folder(m) == "measure"]
    assert len(measuring) >= 8
    named = {str(p.relative_to(PKG)): sorted(_server_kind_names(p)) for p in measuring}
    leaks = {k: v for k, v in named.items() if v}
    assert not leaks, f"measure/ names server kinds (use servers.kinds.server_for): {leaks}"


def test_no_constructor_takes_more_than_six_parameters() -> None:
    wide = []
    for m, path in modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for f in cls.body:
                if isinstance(f, ast.FunctionDef) and f.name == "__init__":
                    a = f.args
                    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) - 1
                    passthrough = n == 0 and a.vararg and a.kwarg  # a subclass of vLLM's
                    if n > MAX_INIT_PARAMS or (not passthrough and (a.kwarg or a.vararg)):
                        wide.append(f"{m}.{cls.name}: {n} parameters")
    assert not wide, "constructors over 6 parameters (group options in a dataclass): " + \
        ", ".join(wide)


def test_the_sweep_loop_is_short() -> None:
    """The loop that measures each config's runs on a supplied server: under 150 lines."""
    loop = PKG / "measure" / "executors" / "local.py"
    assert len(loop.read_text().splitlines()) < 150


def test_the_committed_machines_are_those_git_keeps() -> None:
    """conftest.COMMITTED_MACHINES (what tests read as "every committed report") names exactly
    the machine folders .gitignore un-ignores under outputs/, and none of them is a name this
    box's folder could be given from its hardware (tunebook.results.machines: cpu-… or
    nvidia-… made of slug characters alone; cpu-xeon-vllm0.31.0, a CPU's chapters on one vLLM
    release, has dots no hardware name has)."""
    from conftest import COMMITTED_MACHINES

    gitignore = Path(__file__).resolve().parents[1] / ".gitignore"
    kept = re.findall(r"^!outputs/([^/]+)/$", gitignore.read_text(), re.MULTILINE)
    assert sorted(kept) == sorted(COMMITTED_MACHINES)
    assert not any(re.fullmatch(r"(?:\d+x-)?(?:cpu|nvidia)-[a-z0-9-]+", m)
                   for m in COMMITTED_MACHINES)


def _code(src: str) -> str:
    """Source without its comment lines and docstrings (they may name anything)."""
    code = "\n".join(line for line in src.splitlines() if not line.lstrip().startswith("#"))
    return re.sub(r'"""[\s\S]*?"""', "", code)


def _package_source(pkg: object) -> str:
    """Every module of a package, as one text."""
    return "\n".join(p.read_text() for p in sorted(Path(pkg.__file__).parent.glob("*.py")))


def test_params_sections_are_owned_by_their_mechanisms() -> None:
    """A params section lives next to its mechanism (tunebook.core.sections): params
    imports the owner so it registers, and names nothing of it — no key, no attribute — so a
    new section touches its own module alone."""
    from tunebook.core import sections
    from tunebook.inputs import params

    src = _package_source(params)
    assert sections.SECTIONS.names(), "no registered section"
    for sec in sections.SECTIONS:
        owner = type(sec).__module__.rsplit(".", 1)[-1]
        assert not re.search(rf"\b{owner}\.", src), f"params uses {owner}'s insides"
        assert not re.search(rf"[\"']{re.escape(sec.key)}[\"']", src), \
            f"params names the {sec.key!r} section itself"


def test_measuring_code_names_no_load_kind() -> None:
    """Load kinds are a seam (tunebook.measure.loads): outside their folder and the modules
    they wrap (vLLM's client, the probe), measuring code asks `kind_for` and never names one."""
    named = re.compile(r"BLOCK_REUSE|block_reuse|\bprobe\b|loads\.(client|probe)|VllmClient|"
                       r"BlockReuseProbe")
    measure = PKG / "measure"
    wrapped = {measure / "client.py", measure / "probe.py"}
    offenders = []
    for path in sorted(measure.rglob("*.py")):
        if "loads" in path.relative_to(measure).parts or path in wrapped:
            continue
        if named.search(_code(path.read_text())):
            offenders.append(str(path.relative_to(PKG)))
    assert not offenders, f"measuring code that names a load kind: {offenders}"


def test_params_names_no_dataset_family() -> None:
    """Each family of load datasets owns its keys and rules (tunebook.inputs.datasets): params
    reads the keys every load shares and asks the family, naming none of them. A new load kind
    touches tunebook.inputs.load (its name), tunebook.inputs.datasets (its family) and
    tunebook.measure.loads (how it is sent), never params."""
    from tunebook.inputs import datasets, params

    code = _code(_package_source(params))
    names = [n for f in datasets.FAMILIES for n in f.names if n != "random"]  # the default
    pattern = re.compile("|".join([r"BLOCK_REUSE|PROMPT_DATASETS|\bFILE\b|WORKLOAD_FILE|"
                                   r"\bPROBE\b|SYNTHETIC|PROMPT_SETS",
                                   *(rf"[\"']{re.escape(n)}[\"']" for n in names)]))
    assert not pattern.findall(code), pattern.findall(code)
    for f in datasets.FAMILIES:  # and every key a family owns is a load key params allows
        assert set(f.own_keys) <= set(params.LOAD_KEYS), f.names


def test_each_command_has_one_home() -> None:
    """A subcommand is one module of tunebook.commands with one registered Command, and the
    command line's parser offers exactly the registered commands, in their order."""
    import argparse

    from tunebook import cli
    from tunebook.commands import COMMANDS

    homes = {c.name: type(c).__module__ for c in COMMANDS}
    assert homes and all(re.fullmatch(r"tunebook\.commands\.\w+", m) for m in homes.values()), \
        homes
    assert not {m for m in homes.values() if m.endswith((".base", ".options"))}, homes
    sub = next(a for a in cli.build_parser()._actions
               if isinstance(a, argparse._SubParsersAction))
    assert tuple(sub.choices) == COMMANDS.names()
