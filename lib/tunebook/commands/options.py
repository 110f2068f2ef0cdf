"""What several commands share: the options they spell alike (the params file and its
overrides, --wait, --ray, --again, --no-input) and the steps around them (the params loaded
and checked before anything starts, a dry run described, a dated measurement begun and
ended, the outputs' index rebuilt).

Subcommands import the heavy modules they need (sweep, report, claims: pandas, altair,
papermill) themselves, so `tunebook --help` and a bad-params error answer at once."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tunebook.commands.base import EXIT_OK, EXIT_WORSE_THAN_LAST
from tunebook.core import config
from tunebook.inputs import params as P
from tunebook.inputs.executor import ray_address_problem
from tunebook.inputs.slo import SEARCH, SLO
from tunebook.models.presets import PRESETS, ModelNotFoundError, resolve_model


def _overrides(pairs: list[list[str]] | None) -> dict[str, Any]:
    return {k: P.parse_override(v, k) for k, v in (pairs or [])}


def _add_common(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("params", type=Path, help="params YAML file, e.g. params/quickstart.yaml")
    sp.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="override a dotted key with a YAML value: -p load.users '[1,2]'")
    sp.add_argument("--outputs", type=Path, default=None, help="outputs root (default outputs/)")


def _add_no_input(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--no-input", action="store_true",
                    help="hide the code cells in the HTML report: narrative, figures and "
                         "verdicts only (the executed notebook keeps everything)")


def _wait(args: argparse.Namespace) -> None:
    if getattr(args, "wait", None):
        os.environ["TUNEBOOK_WAIT_S"] = str(args.wait)


def _load(args: argparse.Namespace) -> P.SweepParams:
    return preflight(args.params, _overrides(args.param))


def preflight(path: Path, overrides: dict[str, Any] | None = None) -> P.SweepParams:
    """Every check that needs no engine and writes nothing: the params, then the model.

    A model that cannot be resolved is bad input like any other: a ParamsError naming the
    file and the key `model`. Presets always resolve; building one is left to the real run
    (it writes a cache folder), so a dry run stays free of side effects.
    """
    params = P.load(path, overrides)
    problems = []
    specs = {"model": params.model} | {f"engine_grid[{i}].model": g["model"]
                                       for i, g in enumerate(params.engine_grid) if "model" in g}
    for key, spec in specs.items():
        if spec in PRESETS:
            continue
        try:
            resolve_model(spec)
        except ModelNotFoundError as e:
            problems.append((key, str(e)))
    if problems:
        raise P.ParamsError(params.source, problems)
    return params


def _describe(params: P.SweepParams, outputs: Path) -> str:
    """A dry run: the sweep's plan, or for params with slo/search (their notebook and `tune`
    search) the search's space, budget and stored points; the base config's plan is not what
    runs there."""
    if params.section(SLO) and params.section(SEARCH):
        from tunebook.search import tune as slo_search

        return slo_search.describe(params, outputs)
    from tunebook.measure.sweep import Sweep, SweepOptions

    return Sweep(params, outputs, SweepOptions(progress=False)).describe()


def _ray(args: argparse.Namespace) -> None:
    """`--ray [ADDRESS]`, `--ray-slots N`: through the environment, so a papermill kernel's
    sweep sees them too (tunebook.measure.executors.RAY_ENV)."""
    from tunebook.measure.executors import RAY_ENV, RAY_SLOTS_ENV

    if getattr(args, "ray", None):
        os.environ[RAY_ENV] = args.ray
        if args.ray_slots:
            os.environ[RAY_SLOTS_ENV] = str(args.ray_slots)


def _ray_address(text: str) -> str:
    """An argparse type: `local`, or a Ray address params would take (ray_address_problem)."""
    why = None if text == "local" else ray_address_problem(text)
    if why:
        raise argparse.ArgumentTypeError(why)
    return text


def _at_least(lo: float, typ: type[int] | type[float]) -> Callable[[str], int | float]:
    """An argparse type: a number of `typ`, `lo` or more (argparse says the flag and exits 2)."""
    def parse(text: str) -> int | float:
        value = config.number_at_least(text, typ, lo)
        if value is None:
            kind = "an integer" if typ is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {kind} of {lo:g} or more, got {text!r}")
        return value
    return parse


def _add_again(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--again", action="store_true",
                    help="a new dated measurement of the whole plan, kept beside the earlier "
                         "ones (an unfinished one is resumed); then what changed since the "
                         f"last one, said first (exit {EXIT_WORSE_THAN_LAST}: worse beyond "
                         "noise)")
    sp.add_argument("--worse-than", type=float, default=0.0, metavar="PCT",
                    help=f"with --again: exit {EXIT_WORSE_THAN_LAST} only for a change worse "
                         "beyond noise by more than PCT percent")


def _add_wait(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--wait", type=_at_least(0, float), default=0, metavar="SECONDS",
                    help="wait this long for another sweep holding the machine (default: refuse)")


def _add_ray(sp: argparse.ArgumentParser) -> None:
    sp.add_argument("--ray", nargs="?", const="local", default=None, metavar="ADDRESS",
                    type=_ray_address,
                    help="run each engine config as a Ray task on a cluster (ADDRESS, e.g. "
                         "ray://head:10001 or auto), or on a local one started here")
    sp.add_argument("--ray-slots", type=_at_least(1, int), default=None, metavar="N",
                    help="engines at once on a local Ray cluster (CPU: cores are split "
                         "between them; default 1)")


def _again_begin(args: argparse.Namespace, root: Path) -> Any:
    """--again: a new dated measurement of the plan (or the unfinished last one, resumed);
    its start reaches a papermill kernel's sweep through the environment."""
    from tunebook.results import measurements

    if not getattr(args, "again", False):
        return None
    m, new = measurements.begin(root)
    os.environ[measurements.SINCE_ENV] = m.started
    print(f"{root.name}: {'a new measurement' if new else 'the unfinished measurement'} "
          f"from {m.started}", file=sys.stderr)
    return m


def _again_end(args: argparse.Namespace, root: Path, m: Any, run_ids: set[str]) -> int:
    """--again, after the sweep: the measurement finished once every planned run is ok in it;
    then what changed since the previous one, said first (a terminal table, changes__*.json
    beside the runs). EXIT_WORSE_THAN_LAST when something got worse beyond noise by more than
    --worse-than percent, else EXIT_OK."""
    import json

    from tunebook.core.schema import STATUS_OK
    from tunebook.present import diff
    from tunebook.results import measurements
    from tunebook.results.store import Store, stamp, write_new

    os.environ.pop(measurements.SINCE_ENV, None)
    ok = {str(r["run_id"]) for r in Store(root).rows()
          if r.get("status") == STATUS_OK and measurements.inside(r, m.started)}
    if not run_ids <= ok:
        print(f"{root.name}: this measurement is not finished ({len(run_ids - ok)} run(s) "
              "not ok): the next --again resumes it", file=sys.stderr)
        return EXIT_OK
    measurements.finish(root, m.started)
    prev = measurements.previous(root, m.started)
    if prev is None:
        print(f"{root.name}: the first measurement: nothing to compare with yet")
        return EXIT_OK
    from tunebook.present import history

    old = diff.Side(root, since=prev.started, until=m.started)
    new = diff.Side(root, since=m.started)
    table, figs = diff.run(old, new)
    said = diff.summary(table, figs, args.worse_than)
    data = history.series(root)
    found = history.steps(root, data)
    v = history.verdict_since(root, prev.started, m.started, table, args.worse_than, data,
                              found)
    print(f"since the last measurement ({prev.started}):\n"
          + diff.text(table, figs, old.name, new.name) + "\n" + history.verdict_words(v))
    said.pop("worse")  # the repeats' list; the verdict's own is v["worse"]
    write_new(root / f"changes__{stamp()}.json", json.dumps({
        "previous": prev.started, "this": m.started, **v, "diff_exit_code": said.pop("exit_code"),
        **said}, indent=1, default=str).encode())
    text, found = history.page(root, data=data, found=found)
    (root / "history.html").write_text(text)
    print(f"history: {root / 'history.html'} ({len(found)} step(s) beyond noise over "
          f"{len(measurements.read(root))} measurements)")
    return EXIT_WORSE_THAN_LAST if v["exit_code"] == diff.EXIT_WORSE else EXIT_OK


def _index(outputs: Path) -> Path | None:
    from tunebook.present import index, overview

    path = index.rebuild(outputs)
    if path:
        print(f"index: {path}")
        print(f"overview of the manual's claims: {path.parent / overview.OVERVIEW}")
    return path
