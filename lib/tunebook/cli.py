"""`tunebook` command line. Exit codes: 0 all runs ok, 1 some runs failed (recorded),
2 bad params or bad usage, 3 another sweep holds the experiment or the machine,
130 interrupted (Ctrl-C), 143 terminated (SIGTERM)."""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from tunebook.core import config
from tunebook.core.schema import SchemaVersionError
from tunebook.inputs import params as P
from tunebook.models.presets import PRESETS, ModelNotFoundError, resolve_model
from tunebook.results import machines
from tunebook.servers import sglang as peer

# Subcommands import the heavy modules they need (sweep, report, claims: pandas, altair,
# papermill) themselves, so `tunebook --help` and a bad-params error answer at once.
EXIT_OK, EXIT_FAILED_RUNS, EXIT_BAD_PARAMS, EXIT_LOCKED = 0, 1, 2, 3
EXIT_INTERRUPTED, EXIT_TERMINATED = 130, 143  # 128 + SIGINT / SIGTERM, as shells report them
EXIT_WORSE_THAN_LAST = 4  # --again: worse beyond noise than the last measurement


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
    if params.slo and params.search:
        from tunebook.search import tune as slo_search

        return slo_search.describe(params, outputs)
    from tunebook.measure.sweep import Sweep, SweepOptions

    return Sweep(params, outputs, SweepOptions(progress=False)).describe()


def cmd_plan(args: argparse.Namespace) -> int:
    print(_describe(_load(args), machines.experiments_root(args.outputs, settle=False)))
    return EXIT_OK


def cmd_run(args: argparse.Namespace) -> int:
    """Validate, then execute the params' notebook with papermill and render its HTML."""
    from tunebook.measure.sweep import Sweep, SweepOptions
    from tunebook.present import report
    from tunebook.results.store import not_ok_rows

    _ray(args)  # in the environment: the papermill kernel's sweep reads it
    params = _load(args)
    outputs = machines.experiments_root(args.outputs, settle=not args.dry_run)
    if args.dry_run:
        print(_describe(params, outputs))
        return EXIT_OK
    sweep = Sweep(params, outputs, SweepOptions(progress=False))
    if args.replot and sweep.plan.runs and not sweep.store.rows():
        print(f"tunebook: --replot needs stored runs; {sweep.store.root} has none",
              file=sys.stderr)
        return EXIT_BAD_PARAMS
    if not args.replot and not params.figures_only:
        resolve_model(params.model)  # builds a preset's folder before papermill starts a kernel
    sweep.store.check_writable()
    try:  # `run` executes the chapter notebook; a machine without papermill can still measure
        from papermill.exceptions import PapermillExecutionError
    except ImportError:
        print("tunebook: `run` executes the notebook with papermill, which is not installed "
              "here: `tunebook sweep PARAMS` measures the same runs without it (render the "
              "notebook later, on a machine that has it, with `tunebook run … --replot`)",
              file=sys.stderr)
        return EXIT_BAD_PARAMS
    _wait(args)
    again = None if args.replot else _again_begin(args, sweep.store.root)

    crashed = None
    try:
        ipynb = report.execute(params.notebook, sweep.store.root, {
            "params_file": str(args.params.resolve()),
            "overrides": _overrides(args.param),
            "outputs": str(outputs),
            "interactive": False,  # the tuning notebook runs its params instead of waiting
            **({"dry_run": True} if args.replot else {}),
        }, progress=not args.quiet, replot=args.replot)
    except PapermillExecutionError as e:  # the partial notebook is saved: render it anyway
        crashed = e
        ipynb = report.latest_notebook(sweep.store.root)
        print(f"tunebook: the notebook stopped at cell {e.exec_count}: {e.ename}: {e.evalue}",
              file=sys.stderr)
    df = sweep.store.table()
    failed = len(not_ok_rows(df))
    print(f"executed notebook: {ipynb}")
    print(f"results: {sweep.store.root / 'results.parquet'}  ({len(df)} runs, {failed} not ok)")
    try:
        html = report.to_html(ipynb, no_input=args.no_input)
    except ImportError as e:  # nbconvert absent (the device): render later with `render`
        print(f"HTML not rendered here ({e}); run: tunebook render {sweep.store.root}")
    else:
        print(f"HTML report: {html}")
        _index(outputs)
    if crashed is not None and crashed.ename == "SweepLockedError":
        return EXIT_LOCKED
    changed = EXIT_OK if again is None else _again_end(
        args, sweep.store.root, again, {r.run_id for r in sweep.plan.runs})
    return EXIT_FAILED_RUNS if failed or crashed else changed


def cmd_render(args: argparse.Namespace) -> int:
    """(Re)render the HTML report of an experiment's latest executed notebook."""
    from tunebook.present import report

    html = report.to_html(report.latest_notebook(args.experiment_dir), no_input=args.no_input)
    print(f"HTML report: {html}")
    return EXIT_OK


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
    why = None if text == "local" else P.ray_address_problem(text)
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
    old = diff.Side(root, since=prev.started, until=m.started)
    new = diff.Side(root, since=m.started)
    table, figs = diff.run(old, new)
    said = diff.summary(table, figs, args.worse_than)
    code = said.pop("exit_code")
    print(f"since the last measurement ({prev.started}):\n"
          + diff.text(table, figs, old.name, new.name))
    write_new(root / f"changes__{stamp()}.json", json.dumps({
        "previous": prev.started, "this": m.started, "diff_exit_code": code, **said},
        indent=1, default=str).encode())
    from tunebook.present import history

    text, found = history.page(root)
    (root / "history.html").write_text(text)
    print(f"history: {root / 'history.html'} ({len(found)} step(s) beyond noise over "
          f"{len(measurements.read(root))} measurements)")
    return EXIT_WORSE_THAN_LAST if code == diff.EXIT_WORSE else EXIT_OK


def cmd_sweep(args: argparse.Namespace) -> int:
    """The sweep alone, no notebook (what the notebook calls)."""
    from tunebook.measure.sweep import Sweep, SweepOptions
    from tunebook.present import index

    _wait(args)  # before the Sweep reads it
    _ray(args)
    sweep = Sweep(_load(args), machines.experiments_root(args.outputs, settle=not args.dry_run),
                  SweepOptions(progress=not args.quiet, on_finish=index.rebuild))
    if args.dry_run:
        print(sweep.describe())
        return EXIT_OK
    again = _again_begin(args, sweep.store.root)
    if again is not None:
        sweep.options.since = again.started
    result = sweep.run()
    print(f"{result.ok} ok, {result.failed} not ok, {result.skipped} already done; "
          f"table: {sweep.store.root / 'results.parquet'}")
    if again is not None:
        changed = _again_end(args, sweep.store.root, again,
                             {r.run_id for r in sweep.plan.runs})
        return result.exit_code or changed
    return result.exit_code


def cmd_tune(args: argparse.Namespace) -> int:
    """The SLO search: exit 0 a config meets the SLO, 1 none does, 2 bad params."""
    from tunebook.search import tune as slo_search

    params = _load(args)
    if not params.slo or not params.search:
        print(f"tunebook: {args.params}: no slo/search section: nothing to search (see "
              "params/slo.yaml)", file=sys.stderr)
        return EXIT_BAD_PARAMS
    if args.dry_run:
        print(slo_search.describe(params, machines.experiments_root(args.outputs, settle=False)))
        return EXIT_OK
    _wait(args)
    code, out = slo_search.tune(params, machines.experiments_root(args.outputs),
                                progress=not args.quiet)
    print(slo_search.report_text(out))
    return code


def cmd_claims(args: argparse.Namespace) -> int:
    from tunebook.present import claims
    from tunebook.results.store import find_experiments

    roots = find_experiments(args.root, max_depth=1) if args.root.is_dir() else []
    if not roots:
        print(f"tunebook: no experiment folders (with runs/) under {args.root}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    df = claims.evaluate(roots)
    paths = claims.write(df, args.out or args.root)
    print(claims.to_markdown(df))
    print("written: " + ", ".join(str(p) for p in paths))
    return 0


def _index(outputs: Path) -> Path | None:
    from tunebook.present import index, overview

    path = index.rebuild(outputs)
    if path:
        print(f"index: {path}")
        print(f"overview of the manual's claims: {path.parent / overview.OVERVIEW}")
    return path


def cmd_index(args: argparse.Namespace) -> int:
    asked = args.outputs or args.outputs_opt
    if asked is None:
        machines.experiments_root()  # this box's folder settled: an older tunebook's moved in
    return EXIT_OK if _index(asked or config.outputs_dir()) else EXIT_BAD_PARAMS


def cmd_machine(args: argparse.Namespace) -> int:
    """This box's machine: its name, the folder its experiments land in, its hardware."""
    if args.name:
        try:
            machines.save_name(args.name)
        except machines.MachineNameError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        if os.environ.get(machines.MACHINE_ENV, args.name) != args.name:
            print(f"tunebook: saved, but ${machines.MACHINE_ENV} names this machine "
                  f"{os.environ[machines.MACHINE_ENV]!r} here and wins", file=sys.stderr)
    d = machines.describe()
    print(f"machine: {d['name']}\nexperiments: {config.outputs_dir() / d['name']}\n"
          f"hardware: {d['hardware']}")
    return EXIT_OK


def cmd_compare(args: argparse.Namespace) -> int:
    from tunebook.present import compare

    if len(args.experiments) < 2:
        print("tunebook: compare needs two or more experiment folders", file=sys.stderr)
        return EXIT_BAD_PARAMS
    try:
        out = compare.write(args.experiments, args.out, args.label)
    except (ValueError, FileNotFoundError) as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    print(f"comparison: {out}")
    return EXIT_OK


def cmd_export(args: argparse.Namespace) -> int:
    """Every chart of an experiment's latest notebook as PNG and SVG (for slides); with
    --pdf, its report printed to PDF instead."""
    from tunebook.present import report

    if args.pdf:
        return _export_pdf(args.experiment_dir, args.out)
    paths = report.export_charts(report.latest_notebook(args.experiment_dir),
                                 args.out or args.experiment_dir / "charts", args.format)
    for p in paths:
        print(p)
    return EXIT_OK


def cmd_deploy(args: argparse.Namespace) -> int:
    """An engine config of an experiment (the SLO search's answer unless --config names one)
    as vLLM's config file, container arguments and Helm values; --prove starts vLLM from the
    file here and checks each knob took effect."""
    from tunebook.models.presets import resolve_model
    from tunebook.present import export

    try:
        answer = export.pick(args.experiment_dir, args.config)
    except export.ExportError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    out = args.out or args.experiment_dir / "deploy" / answer.engine_config_id
    for path in export.write(answer, out):
        print(path)
    if not args.prove:
        return EXIT_OK
    checks = export.prove(answer, out / export.FILES[0], resolve_model(answer.model),
                          out / "prove.log", answer.env)
    for knob, c in checks.items():
        seen = c["log"] if "metrics" not in c else f"{c['log']} (/metrics: {c['metrics']})"
        print(f"{'ok ' if c['ok'] else 'NOT'} {knob}: asked {c['asked']}, vLLM took {seen}")
    return EXIT_OK if all(c["ok"] for c in checks.values()) else EXIT_FAILED_RUNS


def cmd_diff(args: argparse.Namespace) -> int:
    """What changed between two sets of runs beyond noise; exit 0 nothing worse (beyond
    --worse-than percent), 1 something worse, 2 bad input or nothing comparable."""
    import json

    from tunebook.present import diff

    sides = [diff.Side(root, getattr(args, f"{s}_version"), getattr(args, f"{s}_config"),
                       getattr(args, f"{s}_since"), getattr(args, f"{s}_until"))
             for s, root in (("old", args.old), ("new", args.new or args.old))]
    try:
        table, figs = diff.run(*sides, metrics=args.metric)
    except diff.DiffError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return diff.EXIT_BAD
    except KeyError as e:
        print(f"tunebook: no metric {e}; known: {', '.join(diff.METRICS)}", file=sys.stderr)
        return diff.EXIT_BAD
    print(diff.text(table, figs, sides[0].name, sides[1].name))
    code = diff.exit_code(table, args.worse_than)
    if args.html:
        args.html.write_text(diff.to_html(table, figs, sides[0].name, sides[1].name))
        print(f"page: {args.html}")
    if args.json:
        args.json.write_text(json.dumps({"old": sides[0].name, "new": sides[1].name,
                                         **diff.summary(table, figs, args.worse_than)},
                                        indent=1, default=str))
    return code


def cmd_history(args: argparse.Namespace) -> int:
    """An experiment's dated measurements as one page: each metric over time, steps marked."""
    from tunebook.present import history

    text, found = history.page(args.experiment_dir)
    out = args.out or args.experiment_dir / "history.html"
    out.write_text(text)
    for s in found:
        print(f"step: {s.metric} at {s.load}, into {s.at}: {s.ratio:.3f}× ({s.verdict}); "
              f"what changed: {s.what_changed}")
    print(f"{len(found)} step(s) beyond noise; page: {out}")
    return EXIT_OK


def _export_pdf(target: Path, out: Path | None) -> int:
    """An experiment's report.html (or any page tunebook wrote, e.g. outputs/overview.html)
    printed by headless Chromium to PDF beside it: report.pdf, overview.pdf."""
    from tunebook.present import browser, report

    page = target if target.suffix == ".html" else target / report.REPORT
    if not page.is_file():
        print(f"tunebook: no {page}: render the report first (tunebook render {target})",
              file=sys.stderr)
        return EXIT_BAD_PARAMS
    try:
        pdf = browser.print_pdf(page, out or page.with_suffix(".pdf"))
    except ImportError as e:  # selenium missing
        print(f"tunebook: printing to PDF needs selenium ({e})", file=sys.stderr)
        return EXIT_BAD_PARAMS
    print(pdf)
    return EXIT_OK


def cmd_pack(args: argparse.Namespace) -> int:
    """One experiment as a verified .tar.gz, to carry between machines."""
    from tunebook.results import archive

    try:
        out = archive.pack(args.experiment_dir, args.out, args.outputs)
    except archive.ArchiveError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    with archive.verified(out) as pack:  # read back: what was written is what will unpack
        files = pack.manifest.files
        print(f"packed {pack.manifest.experiment}: {len(files)} files, "
              f"{sum(e.size_bytes for e in files) / 1e6:.1f} MB "
              f"({out.stat().st_size / 1e6:.1f} MB packed) -> {out}")
    return EXIT_OK


def cmd_unpack(args: argparse.Namespace) -> int:
    """Check a pack in full, then add its files to an outputs folder (local files kept)."""
    from tunebook.results import archive

    try:
        done = archive.unpack(args.archive, args.outputs or config.outputs_dir())
    except archive.ArchiveError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    print(done.summary())
    return EXIT_OK


def cmd_engines(args: argparse.Namespace) -> int:
    from tunebook.servers import process
    from tunebook.servers.shm import reap_shared_memory

    if args.phases:
        from tunebook.results.store import Store, find_experiments
        from tunebook.servers import start_phases

        missing = [str(r) for r in args.phases if not Path(r).is_dir()]
        if missing:
            print(f"tunebook: no such folder: {', '.join(missing)}", file=sys.stderr)
            return EXIT_BAD_PARAMS
        for root in args.phases:
            for exp in find_experiments(root) or [root]:
                frame = start_phases.phases_frame(list(Store(exp).records(requests=False)),
                                                  exp)
                print(f"== {exp}: where each engine start's time went (seconds, ± 1)")
                print(start_phases.table_text(frame))
        return EXIT_OK
    if args.reap:
        print(f"reaped process groups: {process.reap_orphans() or 'none'}")
        shm = reap_shared_memory()
        print(f"removed shared-memory segments dead engines left: {len(shm) or 'none'}")
    live = process.list_engines()
    for info in live:
        print(f"pgid {info['pgid']}  port {info['port']}  owner pid {info['owner_pid']}  "
              f"log {info['log']}")
    if not live:
        print("no tunebook engine is running")
    return EXIT_OK


def cmd_vllm(args: argparse.Namespace) -> int:
    """vLLM releases beside the installed one (tunebook.servers.versions): list, add, remove."""
    from tunebook.servers import versions

    dist, current = versions.installed()
    if args.action == "add":
        try:
            for v in args.versions:
                if v != current:
                    versions.add(v)
        except versions.VersionError as e:
            print(f"tunebook: {e}", file=sys.stderr)
            return EXIT_BAD_PARAMS
    elif args.action == "remove":
        for v in args.versions:
            print(f"vLLM {v}: {'removed' if versions.remove(v) else 'not installed beside'}")
        return EXIT_OK
    print(f"{dist} {current}: installed (tunebook runs on it)")
    for info in versions.listed():
        extra = ", ".join(f"{k} {v}" for k, v in info["packages"].items()
                          if k != info["distribution"])
        print(f"{info['distribution']} {info['version']}: beside it in "
              f"{versions.folder(info['version'])} ({info['bytes'] / 2**20:,.0f} MiB; "
              f"with {extra or 'nothing else'})")
    return EXIT_OK


def cmd_compact(args: argparse.Namespace) -> int:
    """Convert experiments written inline, in place (tunebook.results.compact): each under
    its experiment lock, as a sweep takes it; the logs of engines still running left plain;
    each saved notebook's chart SVG copies dropped where the spec redraws them byte for byte;
    report.html without the CSS it cannot use (tunebook.present.slim_css).
    Exit 0 done (or nothing left to do), 1 some file left as it was, 3 an experiment locked."""
    from tunebook.measure.locks import SweepLockedError, experiment_lock
    from tunebook.present import report
    from tunebook.results import compact
    from tunebook.results.store import Store, find_experiments
    from tunebook.servers import process

    missing = [str(r) for r in args.folders if not Path(r).is_dir()]
    if missing:
        print(f"tunebook: no such folder: {', '.join(missing)}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    experiments = [e for root in args.folders for e in find_experiments(root)]
    if not experiments:
        print(f"tunebook: no experiment folders (with runs/) under "
              f"{', '.join(map(str, args.folders))}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    live = [Path(str(e.get("log"))) for e in process.list_engines() if e.get("log")]
    code = EXIT_OK
    for exp in experiments:
        try:
            with experiment_lock(exp):
                done = compact.convert_experiment(exp, live)
                if done.records:
                    Store(exp).rebuild_table()  # its rows now say schema 2
                notebooks = sorted((exp / "notebooks").glob("*.ipynb"))
                saved = [report.drop_chart_copies(nb) for nb in notebooks]
                page = report.report_path(exp)
                css_saved = report.slim_report(page) if page.is_file() else 0
        except SweepLockedError as e:
            print(f"tunebook: {e}; left as it was", file=sys.stderr)
            code = EXIT_LOCKED
            continue
        print(done.text())
        if any(saved):
            print(f"  notebooks: chart SVG copies dropped from {sum(map(bool, saved))} of "
                  f"{len(saved)} (−{sum(saved) / 1e6:.1f} MB; report.html draws them)")
        if css_saved:
            print(f"  report.html: CSS it cannot use dropped (−{css_saved / 1e3:.0f} kB)")
        if done.problems and code == EXIT_OK:
            code = EXIT_FAILED_RUNS
    return code


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tunebook", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sp = sub.add_parser("run", help="execute the params' notebook with papermill, render HTML")
    _add_common(sp)
    sp.add_argument("--dry-run", action="store_true", help="print the plan; start nothing")
    sp.add_argument("--replot", action="store_true",
                    help="execute the notebook on the stored results only (its dry_run): "
                         "figures and claims redrawn by this code, no engine started — e.g. "
                         "for results brought back from a GPU box")
    sp.add_argument("-q", "--quiet", action="store_true")
    _add_wait(sp)
    _add_ray(sp)
    _add_no_input(sp)
    _add_again(sp)
    sp.set_defaults(fn=cmd_run)
    sp = sub.add_parser("plan", help="print what would run (a dry run)")
    _add_common(sp)
    sp.set_defaults(fn=cmd_plan)
    sp = sub.add_parser("sweep", help="run the sweep without a notebook")
    _add_common(sp)
    sp.add_argument("--dry-run", action="store_true")
    sp.add_argument("-q", "--quiet", action="store_true")
    _add_wait(sp)
    _add_ray(sp)
    _add_again(sp)
    sp.set_defaults(fn=cmd_sweep)
    sp = sub.add_parser("tune", help="the config that serves the most within an SLO: an "
                                     "adaptive search (exit 0 found, 1 none meets the SLO)")
    _add_common(sp)
    sp.add_argument("--dry-run", action="store_true", help="print the space; start nothing")
    sp.add_argument("-q", "--quiet", action="store_true")
    _add_wait(sp)
    sp.set_defaults(fn=cmd_tune)
    sp = sub.add_parser("render", help="render an experiment's executed notebook to HTML")
    sp.add_argument("experiment_dir", type=Path, help="e.g. outputs/h200/ch04")
    _add_no_input(sp)
    sp.set_defaults(fn=cmd_render)
    sp = sub.add_parser("claims", help="the claims table (manual vs measured, with verdicts) "
                                       "of every experiment under a folder")
    sp.add_argument("root", type=Path, help="a folder of experiments, e.g. outputs/h200")
    sp.add_argument("--out", type=Path, default=None,
                    help="where claims.{csv,md,html,json} go (default: ROOT)")
    sp.set_defaults(fn=cmd_claims)
    sp = sub.add_parser("index", help="rebuild outputs/index.html (every experiment, with "
                                      "links and headline numbers)")
    sp.add_argument("outputs", type=Path, nargs="?", default=None,
                    help="the outputs folder (default: $TUNEBOOK_OUTPUTS or outputs/)")
    sp.add_argument("--outputs", type=Path, dest="outputs_opt", default=None,
                    help="the same, as the other commands spell it")
    sp.set_defaults(fn=cmd_index)
    sp = sub.add_parser("machine", help="this box's machine name and the folder under "
                                        "outputs/ its experiments land in (named from its "
                                        "hardware unless named once with --name or "
                                        "$TUNEBOOK_MACHINE)")
    sp.add_argument("--name", default=None, help="name this machine from now on")
    sp.set_defaults(fn=cmd_machine)
    sp = sub.add_parser("compare", help="overlay two or more experiments in one chart per "
                                        "metric (an offline HTML page)")
    sp.add_argument("experiments", type=Path, nargs="+", help="experiment folders")
    sp.add_argument("--label", action="append", default=None,
                    help="a label per experiment, in order (default: their paths)")
    sp.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    sp.set_defaults(fn=cmd_compare)
    sp = sub.add_parser("export", help="write every chart of an experiment's latest notebook "
                                       "as PNG and SVG (vl-convert), or with --pdf its report "
                                       "as one PDF")
    sp.add_argument("experiment_dir", type=Path,
                    help="an experiment folder; with --pdf also a page such as "
                         "outputs/overview.html")
    sp.add_argument("--out", type=Path, default=None,
                    help="default: EXPERIMENT_DIR/charts; with --pdf, EXPERIMENT_DIR/report.pdf")
    sp.add_argument("--format", action="append", default=None, choices=["png", "svg", "pdf"])
    sp.add_argument("--pdf", action="store_true",
                    help="print the report (report.html) to report.pdf with headless Chromium "
                         "instead, every folded reasoning unfolded")
    sp.set_defaults(fn=cmd_export)
    sp = sub.add_parser("deploy", help="an engine config (the SLO search's answer unless "
                                       "--config names one) as vLLM's config file (vllm serve "
                                       "--config), container arguments and Helm values")
    sp.add_argument("experiment_dir", type=Path)
    sp.add_argument("--config", default=None, help="an engine_config_id or its label")
    sp.add_argument("--out", type=Path, default=None,
                    help="default: EXPERIMENT_DIR/deploy/ENGINE_CONFIG_ID")
    sp.add_argument("--prove", action="store_true",
                    help="start vLLM here from the config file and check each knob took "
                         "effect (its start-up log, /metrics)")
    sp.set_defaults(fn=cmd_deploy)
    sp = sub.add_parser("diff", help="what changed between two sets of runs (two "
                                     "experiments, two vLLM versions or two dates) beyond noise: "
                                     "exit 0 nothing worse, 1 worse, 2 nothing comparable")
    sp.add_argument("old", type=Path, help="an experiment folder")
    sp.add_argument("new", type=Path, nargs="?", default=None,
                    help="an experiment folder (default: OLD, narrowed by the --new-* options)")
    for s in ("old", "new"):
        sp.add_argument(f"--{s}-version", default=None, help=f"only the {s} side's runs "
                                                              "served by this vLLM version")
        sp.add_argument(f"--{s}-config", default=None, help="only this engine config "
                                                             "(label or engine_config_id)")
        sp.add_argument(f"--{s}-since", default=None, help="runs started at or after this "
                                                            "UTC ISO time")
        sp.add_argument(f"--{s}-until", default=None, help="runs started before this UTC "
                                                            "ISO time")
    sp.add_argument("--metric", action="append", default=None,
                    help="a metric to compare (repeatable; default: throughput, TTFT, TPOT, "
                         "ITL, goodput, energy and cost where present)")
    sp.add_argument("--worse-than", type=float, default=0.0, metavar="PCT",
                    help="exit 1 only for a change worse beyond noise by more than PCT "
                         "percent (default 0: any)")
    sp.add_argument("--html", type=Path, default=None, help="also write the page here")
    sp.add_argument("--json", type=Path, default=None,
                    help="also write a small JSON summary (exit code, counts, what got worse)")
    sp.set_defaults(fn=cmd_diff)
    sp = sub.add_parser("history", help="an experiment's dated measurements (--again): each "
                                        "metric over time, steps beyond noise marked with "
                                        "what changed")
    sp.add_argument("experiment_dir", type=Path)
    sp.add_argument("--out", type=Path, default=None, help="default: EXPERIMENT_DIR/history.html")
    sp.set_defaults(fn=cmd_history)
    sp = sub.add_parser("pack", help="an experiment as one .tar.gz with a manifest (each "
                                     "file's size and SHA-256), to carry to another machine")
    sp.add_argument("experiment_dir", type=Path, help="e.g. outputs/h200/ch04")
    sp.add_argument("--out", type=Path, default=None,
                    help="the file to write (default: <machine>-<experiment>__<utc>.tar.gz here)")
    sp.add_argument("--outputs", type=Path, default=None,
                    help="the outputs root the experiment's name is relative to (default: "
                         "$TUNEBOOK_OUTPUTS or outputs/)")
    sp.set_defaults(fn=cmd_pack)
    sp = sub.add_parser("unpack", help="check a pack in full, then add its files to an outputs "
                                       "folder: files already there are kept, never replaced")
    sp.add_argument("archive", type=Path, help="a file `tunebook pack` wrote")
    sp.add_argument("--outputs", type=Path, default=None,
                    help="the outputs root (default: $TUNEBOOK_OUTPUTS or outputs/)")
    sp.set_defaults(fn=cmd_unpack)
    sp = sub.add_parser("engines", help="list engines tunebook left running; --reap kills "
                                        "those whose owner is gone")
    sp.add_argument("--reap", action="store_true")
    sp.add_argument("--phases", type=Path, nargs="+", metavar="EXPERIMENT_DIR",
                    help="instead: the start-up phases of every engine start stored under "
                         "these folders (an experiment, or e.g. outputs/h200)")
    sp.set_defaults(fn=cmd_engines)
    sp = sub.add_parser("vllm", help="vLLM releases installed beside this one, for the "
                                     "`vllm` engine knob (engine_grid: [{}, {vllm: \"0.31.0\"}])")
    sp.add_argument("action", nargs="?", choices=("list", "add", "remove"), default="list")
    sp.add_argument("versions", nargs="*", metavar="VERSION", help="e.g. 0.31.0")
    sp.set_defaults(fn=cmd_vllm)
    sp = sub.add_parser("compact", help="store experiments compact, in place: each run's "
                                        "per-request arrays in a Parquet file beside its JSON, "
                                        "engine logs gzipped (each proven equal first), "
                                        "notebooks' chart SVG copies dropped where the chart's "
                                        "spec redraws them exactly, reports' unusable CSS "
                                        "dropped")
    sp.add_argument("folders", type=Path, nargs="+", metavar="FOLDER",
                    help="an experiment, or a folder of them (e.g. outputs/h200)")
    sp.set_defaults(fn=cmd_compact)
    return ap


def main(argv: list[str] | None = None) -> int:
    from tunebook.measure.locks import SweepLockedError, Terminated
    from tunebook.measure.supply import DeadlineNear

    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except (P.ParamsError, ModelNotFoundError, SchemaVersionError,
            peer.EngineNotInstalledError, config.EnvError) as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    except SweepLockedError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_LOCKED
    except BrokenPipeError:  # `tunebook plan … | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + 13  # what a shell reports for SIGPIPE
    except OSError as e:
        print(f"tunebook: {e}", file=sys.stderr)
        return EXIT_BAD_PARAMS
    except KeyboardInterrupt:
        print("tunebook: interrupted; finished runs are saved — run again to resume",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    except Terminated as e:
        print(f"tunebook: {e}" if isinstance(e, DeadlineNear) else
              "tunebook: terminated (SIGTERM); finished runs are saved — run again to resume",
              file=sys.stderr)
        return EXIT_TERMINATED


def _quiet_exit(code: int) -> NoReturn:
    """Exit as Python would, minus the interpreter's teardown when triton's compiled module is
    loaded (vLLM imports it): at teardown its nanobind bindings print dozens of "leaked
    function" lines that say nothing about the command. Everything that can still matter runs
    first, as at a normal exit: non-daemon threads are joined, atexit handlers run (engines
    stopped, logs flushed; an error in one is printed), stdout and stderr are flushed."""
    if "triton._C.libtriton" not in sys.modules:
        sys.exit(code)
    for t in threading.enumerate():
        if t is not threading.main_thread() and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def entry() -> NoReturn:
    """The `tunebook` command (`main` returns its exit code, for callers in-process)."""
    _quiet_exit(main())


if __name__ == "__main__":
    entry()
