"""What one module that nothing of tunebook needs costs every process that imports it.

jsonschema (imported by altair and nbformat, so by every notebook kernel that draws a chart,
every `tunebook run` that renders, papermill, nbconvert) imports `rfc3987_syntax` when it is
installed, to check the "iri" string format; that module builds 39 Lark grammars while it is
imported, about a second of a core each time (`python -X importtime -c "import jsonschema"`).
jupyter-events pulls it in (`jsonschema[format-nongpl]`); tunebook never checks an IRI, so
`make install` removes it (Makefile). This measures each command below in a fresh process, as
installed and with the module blocked (a folder first on PYTHONPATH whose `rfc3987_syntax`
raises ImportError, as if it were not installed; papermill's kernel inherits it), rounds
interleaved. CPU seconds of the command and every process it waited for (its kernel):
`resource.getrusage(RUSAGE_CHILDREN)`, so what else runs on the box does not count.

- replot: `tunebook run params/ch02.yaml --replot` on a copy of the committed cpu/ch02 (the
  notebook executed on stored rows, the HTML report, the index): what make test's background
  replots run 12 times and a user runs after every sweep;
- kernel imports: what a chapter notebook's first cell imports (tunebook.charts, altair);
- CLI imports: papermill, nbconvert and the run command.

Where the module is not installed (after `make install`) both arms are the same; to see the
cost, put it back first (`.venv/bin/pip install --no-deps rfc3987-syntax==1.1.0`) and remove
it after.

    .venv/bin/python benchmarks/import_costs.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BLOCKED = "rfc3987_syntax"
COMMANDS = {
    "replot": None,  # built per round: a fresh copy of the stored experiment
    "kernel imports": [sys.executable, "-c",
                       "import tunebook.charts.plots, tunebook.present.workbook"],
    "CLI imports": [sys.executable, "-c", "import papermill, nbconvert, tunebook.commands.run"],
}


def _cpu_s(cmd: list[str], env: dict[str, str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # exit 1 is a replot's "some configs failed": ch02 keeps its out-of-memory starts
    rc = subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.DEVNULL,
                        stderr=subprocess.DEVNULL).returncode
    if rc not in (0, 1):
        raise SystemExit(f"{cmd} exited {rc}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _replot(tmp: Path) -> list[str]:
    out = Path(tempfile.mkdtemp(dir=tmp))
    shutil.copytree(REPO / "outputs" / "cpu" / "ch02", out / "ch02")
    return [sys.executable, "-m", "tunebook.cli", "run", "params/ch02.yaml", "--outputs",
            str(out), "--replot", "-q"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    installed = importlib.util.find_spec(BLOCKED) is not None
    print(f"{BLOCKED}: {'installed' if installed else 'not installed (both arms alike)'}")
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        shim = tmp / "shim" / BLOCKED
        shim.mkdir(parents=True)
        (shim / "__init__.py").write_text(f"raise ImportError('{BLOCKED} blocked')\n")
        lib = str(REPO / "lib")
        base = {**os.environ, "PYTHONPATH": os.pathsep.join(
            p for p in (lib, os.environ.get("PYTHONPATH")) if p)}
        arms = {"as installed": base,
                "blocked": {**base, "PYTHONPATH": os.pathsep.join((str(shim.parent),
                                                                   base["PYTHONPATH"]))}}
        got: dict[tuple[str, str], list[float]] = {}
        for _ in range(args.rounds):
            for name, cmd in COMMANDS.items():
                for arm, env in arms.items():
                    got.setdefault((name, arm), []).append(
                        _cpu_s(cmd or _replot(tmp), env))
    print(f"\nCPU seconds, min / median / max of {args.rounds} (one run; the ratio is what "
          "to compare)\n")
    print("| command | as installed | blocked | blocked ÷ installed |")
    print("|---|---|---|---|")
    for name in COMMANDS:
        a, b = got[(name, "as installed")], got[(name, "blocked")]
        fmt = lambda v: " / ".join(f"{x:.2f}" for x in (min(v), statistics.median(v), max(v)))  # noqa: E731
        print(f"| {name} | {fmt(a)} | {fmt(b)} | "
              f"{statistics.median(b) / statistics.median(a):.2f} |")


if __name__ == "__main__":
    main()
