"""The SLO search against the full grid on the same space (issue 15). Not a test: one run each.

Runs the full grid (every engine config at every load level) into `<experiment>-grid` and the
search into `<experiment>-search` — separate experiments, so the live search reuses none of the
grid's stored runs — then writes both answers, both engine times and the ratio. `--replay N`
also replays the search N times (seeds 0..N-1) on the grid's measured points, charging each
point what it cost in the grid (a tabular benchmark: the method's answer and engine time on the
same measurements, without the run-to-run noise of two live runs).

    .venv/bin/python benchmarks/slo_bench.py params/slo.yaml --out outputs/cpu/slo-bench \
        --replay 50
    # on the lent H200, through scripts/h200_run.sh (--out outputs/h200/slo-search is added):
    bash scripts/h200_run.sh '@560:bench slo_bench.py params/slo-h200.yaml --kinds grid'

Engine time = seconds spent inside sweeps (engine starts, warm-ups, runs, stops). Both start
with empty compile caches (tunebook.servers.compile_cache.clear), so neither inherits the other's.
`--out DIR` keeps both experiments and the report (benchmark.md, benchmark.json) in DIR.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from tunebook.core import config, hardware
from tunebook.inputs import params as P
from tunebook.inputs import slo
from tunebook.measure.locks import Terminated, sigterm_as_exception
from tunebook.results.compact import REQUESTS_SUFFIX
from tunebook.results.store import Store, stamp, write_new
from tunebook.search import adaptive
from tunebook.search import tune as slo_search
from tunebook.servers import compile_cache


def replay(grid: dict, spec: slo.SearchSpec, bounds: tuple[slo.Bound, ...], seeds: int,
           tolerance: float) -> list[dict[str, Any]]:
    """The search replayed on the grid's points, once per seed: what it picked, how the grid
    scored that pick, and what it would have cost."""
    best = grid["best"][spec.objective] if "best" in grid else None
    scores = {repr(sorted(c["knobs"].items())): c["score"] for c in grid["configs"]}
    missing = {repr(sorted(k.items())) for k in grid.get("missing_configs") or []}
    out = []
    for seed in range(seeds):
        ev = adaptive.Replay(grid, spec.objective)
        res = adaptive.search(ev, dataclasses.replace(spec, seed=seed), bounds)
        pick = res.best
        picked = scores.get(repr(sorted(pick.knobs.items()))) if pick else None
        out.append({
            "seed": seed, "pick": pick.knobs if pick else None, "grid_score_of_pick": picked,
            "same": pick is not None and "best" in grid and pick.knobs == grid["best"]["knobs"],
            "within": (picked is not None and best is not None
                       and picked >= (1 - tolerance) * best),
            "configs": ev.engine_starts, "points": len(res.points),
            # proposed configs the grid lacks: each answered "failed" at no cost
            "missing_touched": len(ev.touched & missing),
            "engine_s": round(ev.engine_s, 1),
            "ratio": round(ev.engine_s / max(grid["engine_s"], 1e-9), 3),
            "stopped": res.stopped})
    return out


REPLAY_HEAD = ("same config as the grid | within noise | engine time ÷ grid: median | p90 | "
               "max | configs started: median | max |")


def replay_cells(reps: list[dict[str, Any]]) -> str:
    """One table row's cells (REPLAY_HEAD) for a batch of replays."""
    ratios = sorted(r["ratio"] for r in reps)
    n = len(reps)
    return (f"{sum(r['same'] for r in reps)}/{n} | {sum(r['within'] for r in reps)}/{n} | "
            f"{statistics.median(ratios):.2f} | {ratios[min(n - 1, int(0.9 * n))]:.2f} | "
            f"{ratios[-1]:.2f} | {statistics.median(r['configs'] for r in reps):g} | "
            f"{max(r['configs'] for r in reps)} |")


def live_stop(live: dict, spec: slo.SearchSpec, bounds: tuple[slo.Bound, ...],
              min_gain: float) -> dict[str, Any] | None:
    """Where the live search would have stopped under `budget.min_gain`: the search replayed on
    its own stored points with the same seed. The stopping rule changes no proposal (TPE sees
    the same scores in the same order), so the replay retraces the live run and only stops
    sooner or later. None when it would have gone past the live record (a point not run)."""
    ev = adaptive.Replay(live, spec.objective)
    try:
        res = adaptive.search(ev, dataclasses.replace(spec, min_gain=min_gain), bounds)
    except KeyError:
        return None
    best = res.best
    return {"min_gain": min_gain, "configs": ev.engine_starts, "points": len(res.points),
            "engine_s": round(ev.engine_s, 1), "stopped": res.stopped,
            "best": ({"knobs": best.knobs, spec.objective: best.score}
                     if best is not None and best.score is not None else None)}


def missing_note(reps: list[dict[str, Any]]) -> str:
    """Say how many replays proposed a config the grid lacks (charged nothing for it, so
    their cost reads low), when any did."""
    hit = sum(1 for r in reps if r.get("missing_touched"))
    return (f"{hit} of {len(reps)} replays proposed a config the grid lacks: it answered "
            "nothing and cost nothing, so their engine time reads low (a measured config "
            "costs a start of 58–145 s on the H200).\n" if hit else "")


def where_it_ran(experiment: Path) -> dict[str, Any]:
    """The machine and software the grid's rows were measured on (this machine when none)."""
    rows = Store(experiment).latest_rows(
        p.name.split("__")[0] for p in sorted((experiment / "runs").glob("*.json"))[:1])
    m = hardware.machine()
    return {**m, **{k: rows[0][k] for k in m if rows and rows[0].get(k) is not None}}


def reuse_grid(params: Any, spec: slo.SearchSpec, outputs: Path, earlier: list[Path]) -> int:
    """Copy earlier grids' stored runs of this space's engine configs (same ids: same config,
    same load) into this grid's folder, with their engine logs; a file already there is kept,
    never overwritten. A wider space then measures only its new configs. Returns the runs
    copied."""
    import shutil

    from tunebook.inputs.plan import make_plan

    grid = dataclasses.replace(params, experiment=f"{params.experiment}-grid")
    ev = slo_search.SweepEvaluator(grid, outputs, progress=False, stored_only=True)
    ids = {make_plan(ev.point_params(knobs, spec.users[0])).engines[0].id
           for knobs in spec.grid()}
    copied = 0
    for src in earlier:
        for sub in ("runs", "engines"):
            dest = Path(outputs) / grid.experiment / sub
            # a run's Parquet file of arrays before the JSON that names it, as the store does
            for f in sorted((src / sub).glob("*"), key=lambda f: (not f.name.endswith(
                    REQUESTS_SUFFIX), f.name)):
                if f.name.split("-")[0].split("__")[0] in ids and not (dest / f.name).exists():
                    dest.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dest / f.name)
                    copied += sub == "runs" and f.suffix == ".json"  # runs, not files
    return copied


def starts_by_config(experiment: Path) -> dict[str, float]:
    """Each engine config's start in an experiment's stored runs (startup_s of its first
    row that has one: what the search's and the grid's costs charge once per config)."""
    out: dict[str, float] = {}
    rows = Store(experiment).rows() if (experiment / "runs").is_dir() else []
    for r in sorted(rows, key=lambda r: str(r.get("started_at"))):
        if isinstance(r.get("startup_s"), int | float) and r.get("engine_config_id"):
            out.setdefault(str(r["engine_config_id"]), float(r["startup_s"]))
    return out


def fast_start_grid(g: dict, grid_dir: Path, search_dir: Path) -> dict[str, Any] | None:
    """The full grid costed with the live search's starts: each grid config's start replaced
    by the search's start of the same config, else by the median of the search's starts;
    its points' runs as the grid measured them. None: the search stored no start."""
    new, old = starts_by_config(search_dir), starts_by_config(grid_dir)
    if not new or not old:
        return None
    typical = statistics.median(new.values())
    runs = g["engine_s"] - sum(old.values())
    return {"engine_s": round(runs + sum(new.get(k, typical) for k in old), 1),
            "grid_median_start_s": round(statistics.median(old.values()), 1),
            "search_median_start_s": round(typical, 1),
            "configs_started_by_both": len(old.keys() & new.keys()), "grid_configs": len(old)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", type=Path)
    ap.add_argument("--outputs", type=Path, default=None)
    ap.add_argument("--kinds", nargs="*", choices=("grid", "search"),
                    default=["grid", "search"],
                    help="which to run now; the other's newest stored summary is reused "
                         "(none: only report and replay what is stored)")
    ap.add_argument("--out", type=Path, default=None,
                    help="a folder for both experiments and the report, or a .md file for "
                         "the report alone (default: OUTPUTS/<experiment>-search/benchmark.md)")
    ap.add_argument("--replay", type=int, default=0, metavar="N",
                    help="also replay the search on the grid's points with seeds 0..N-1")
    ap.add_argument("--stored-only", action="store_true",
                    help="start no engine: rebuild the grid's summary from its stored points "
                         "(a grid measured over several device calls); points not stored are "
                         "reported missing")
    ap.add_argument("--noise-check", type=int, default=0, metavar="N",
                    help="measure the grid's answer, the live search's pick and the baseline N "
                         "times more each (one engine start each), to judge 'within noise'; "
                         "with --stored-only, read back the repeats stored before")
    ap.add_argument("--reuse", type=Path, nargs="+", default=[], metavar="GRID",
                    help="earlier grid folders (…/<experiment>-grid) whose stored runs of "
                         "this space's configs are copied in first (never overwriting)")
    ap.add_argument("--grid-outputs", type=Path, default=None, metavar="DIR",
                    help="where the grid experiment lives when not beside the search (a fresh "
                         "live search in its own folder, compared with a grid measured before)")
    ap.add_argument("--live-stop", type=float, nargs="+", default=[], metavar="MIN_GAIN",
                    help="also say where the stored live search would have stopped under "
                         "each budget.min_gain (replayed on its own points, same seed)")
    ap.add_argument("--tolerance", type=float, default=None,
                    help="a pick the grid scores within this fraction of its best counts as "
                         "'within the grid's noise' (default: the grid answer's spread from "
                         "--noise-check, else 0.05)")
    args = ap.parse_args()
    params = P.load(args.params)
    if args.out is not None and args.out.suffix != ".md":
        outputs, report = args.out, args.out / "benchmark.md"
    else:
        outputs = args.outputs or config.outputs_dir()
        report = args.out or Path(outputs) / f"{params.experiment}-search" / "benchmark.md"
    bounds = slo.parse_slo(list(params.section(slo.SLO)))
    spec = slo.parse_search(params.section(slo.SEARCH), params.load.users)
    if args.reuse:
        n = reuse_grid(params, spec, Path(args.grid_outputs or outputs), args.reuse)
        print(f"reused {n} stored runs from {', '.join(map(str, args.reuse))}", flush=True)
    results: dict[str, dict | None] = {}
    grid_outputs = args.grid_outputs or outputs
    for kind in ("grid", "search"):
        p = dataclasses.replace(params, experiment=f"{params.experiment}-{kind}")
        where = grid_outputs if kind == "grid" else outputs
        if kind == "grid" and args.stored_only:
            ev = slo_search.SweepEvaluator(p, where, progress=False, stored_only=True)
            out = slo_search.summary(p, adaptive.full_grid(ev, spec, bounds), ev)
            out["missing_configs"] = [c["knobs"] for c in out["configs"] if all(
                q["value"] is None and not q.get("seconds") for q in c["points"])]
            results[kind] = out
            continue
        if kind not in args.kinds:
            results[kind] = slo_search.stored(where, p.experiment)
            continue
        ev = slo_search.SweepEvaluator(p, where, progress=True)
        # both start from empty compile caches (a fair race); a resumed one keeps its caches
        if compile_cache.enabled() and not any(ev.store.runs_dir.glob("*.json")):
            compile_cache.clear()
        t0 = time.monotonic()
        try:  # SIGTERM (a device call's limit) stops the engine; stored points resume
            with sigterm_as_exception():
                res = (adaptive.full_grid(ev, spec, bounds) if kind == "grid"
                       else adaptive.search(ev, spec, bounds))
        finally:
            ev.close()
        out = slo_search.summary(p, res, ev)
        out["wall_s"] = round(time.monotonic() - t0, 1)
        folder = Path(where) / p.experiment / "search"
        folder.mkdir(parents=True, exist_ok=True)
        write_new(folder / f"{stamp()}.json", json.dumps(out, indent=1, default=str).encode())
        results[kind] = out
        print(f"== {kind}: {slo_search.report_text(out)}", flush=True)
    g, s = results["grid"], results["search"]
    if g is None:
        print(f"no full grid stored under {grid_outputs}: nothing to compare (run --kinds grid)")
        return 0
    if not g["configs"] or sum(len(c["points"]) for c in g["configs"]) < g["grid_points"]:
        print(f"the stored grid is incomplete ({sum(len(c['points']) for c in g['configs'])} of "
              f"{g['grid_points']} points): run --kinds grid again to finish it")
    m = where_it_ran(Path(grid_outputs) / f"{params.experiment}-grid")
    obj = spec.objective

    def answer(o: dict) -> str:
        if "best" not in o:
            return "none meets the SLO"
        b = o["best"]
        return f"`{b['knobs']}` at {b['users']} users, {b[obj]:,.1f} {obj}"

    def row(name: str, o: dict) -> str:
        measured = sum(1 for c in o["configs"] for q in c["points"] if "seconds" in q)
        return (f"| {name} | {answer(o)} | {measured} | {o['engine_starts']} | "
                f"{o['engine_s']:.0f} | {o['engine_s'] / max(g['engine_s'], 1e-9):.2f} |")

    text = f"""# SLO search vs the full grid

Command: `python benchmarks/slo_bench.py {' '.join(sys.argv[1:])}` ({m['hardware']},
{m['vllm_package']}, Python {m['python_version']}, tunebook {m['tunebook_commit']},
{time.strftime('%Y-%m-%d')}).
SLO: {' and '.join(str(b) for b in bounds)}; objective {obj}; space: {len(spec.grid())} engine
configs × {len(spec.users)} load levels; search: {spec.sampler}, {spec.startup} random configs
first, budget {spec.to_dict().get('budget', 'none')}, baseline {spec.baseline}.

| | answer | points run | engine starts | engine time s | ÷ grid |
|---|---|---|---|---|---|
{row("full grid", g)}
"""
    stops: list[dict[str, Any] | None] = []
    paired: dict[str, Any] | None = None
    fractions: dict[str, Any] = {}
    fast = fast_start_grid(g, Path(grid_outputs) / f"{params.experiment}-grid",
                           Path(outputs) / f"{params.experiment}-search")
    if s is not None:
        fractions["search_engine_s_over_grid"] = round(s["engine_s"] / g["engine_s"], 3)
    if fast is not None:
        text += (f"\nThe grid costed with the live search's starts (median "
                 f"{fast['search_median_start_s']:.0f} s against the grid's "
                 f"{fast['grid_median_start_s']:.0f} s; {fast['configs_started_by_both']} of "
                 f"{fast['grid_configs']} configs with their own start, the rest at that "
                 f"median; its runs as measured): {fast['engine_s']:.0f} s")
        if s is not None:
            fractions["search_engine_s_over_fast_start_grid"] = round(
                s["engine_s"] / fast["engine_s"], 3)
            text += (f"; the live search spent "
                     f"**{fractions['search_engine_s_over_fast_start_grid']:.2f}×** it")
        text += ".\n"
    if s is not None:
        text += row(f"live search ({spec.sampler}, seed {spec.seed})", s) + "\n"
        same = ("best" in g) == ("best" in s) and (
            "best" not in g or g["best"]["knobs"] == s["best"]["knobs"])
        text += f"\nLive search: same config as the grid: **{'yes' if same else 'no'}**"
        if not same and "best" in g and "best" in s:
            pick = next((c for c in g["configs"] if c["knobs"] == s["best"]["knobs"]), None)
            if pick is not None and pick["knobs"] in (g.get("missing_configs") or []):
                # the grid has not measured it: only the search's own number compares
                text += (f"; the grid has not measured its pick yet; the search's own "
                         f"{s['best'][obj]:,.1f} {obj} is "
                         f"{s['best'][obj] / g['best'][obj]:.2f}× the grid's best")
            elif pick is not None:  # the grid's own measurement of the search's pick
                text += (f"; the grid measured its pick at {pick['score'] or 0:,.1f} {obj} "
                         f"({(pick['score'] or 0) / g['best'][obj]:.2f}× the grid's best)")
        text += f" (stopped: {s['stopped']})"
        ran = s.get("search", {}).get("budget")
        if ran != spec.to_dict().get("budget"):  # the params changed since the search ran
            text += f"; it ran with budget {ran}, before the params' {spec.to_dict().get('budget')}"
        text += ".\n"
        paired = slo_search.paired_points(s, g)
        if paired:
            flips = "; ".join(f"`{f['knobs']}` at {f['users']} users (meets: search "
                              f"{f['meets'][0]}, grid {f['meets'][1]})"
                              for f in paired["verdict_flips"])
            text += (f"\nRun-to-run noise, at no extra engine time: {paired['n']} points were "
                     f"measured by both the live search and the grid (same config and load, "
                     f"each on its own engine start). {obj} differs by "
                     f"{paired['median_dev']:.1%} in the median and {paired['max_dev']:.1%} "
                     f"at most; the SLO verdict differs at {len(paired['verdict_flips'])}"
                     + (f": {flips}" if flips else "") + ".\n")
        stops = [live_stop(s, spec, bounds, mg) for mg in args.live_stop]
        if stops:
            text += ("\nThe same live search under another stopping rule (replayed on its own "
                     "points, same seed: the rule changes no proposal, only where it stops):\n\n"
                     "| budget.min_gain | configs started | engine time s | ÷ grid | answer | "
                     "÷ the grid's best |\n|---|---|---|---|---|---|\n")
            for mg, st in zip(args.live_stop, stops, strict=True):
                if st is None:
                    text += f"| {mg:g} | would have run past the live record | | | | |\n"
                    continue
                b = st["best"]
                text += (f"| {mg:g} | {st['configs']} | {st['engine_s']:.0f} | "
                         f"{st['engine_s'] / max(g['engine_s'], 1e-9):.2f} | "
                         + (f"`{b['knobs']}`, {b[obj]:,.1f} | "
                            f"{b[obj] / g['best'][obj]:.2f}× |" if b and "best" in g
                            else "none | |") + "\n")
    base = g.get("baseline")
    if base and "best" in g and base["knobs"] not in (g.get("missing_configs") or []):
        bs = base.get(obj)
        diff = {k: (base["knobs"][k], v) for k, v in g["best"]["knobs"].items()
                if base["knobs"].get(k) != v}
        text += ("\nBaseline (vLLM's defaults) in the grid: "
                 + (f"{bs:,.1f} {obj} at {base['users']} users; the grid's answer serves "
                    f"**{g['best'][obj] / bs:.2f}×** it at the same SLO"
                    if bs else "meets the SLO at no load level")
                 + (f"; the knobs that differ: {diff}" if diff else "") + ".\n")
    noise: list[dict] = []
    tolerance = args.tolerance
    if args.noise_check and "best" in g:
        picks = {"grid's answer": g["best"]}
        if s is not None and "best" in s and s["best"]["knobs"] != g["best"]["knobs"]:
            picks["live search's pick"] = s["best"]
        if (base and base.get("users") and base["knobs"] != g["best"]["knobs"]
                and not (s and "best" in s and base["knobs"] == s["best"]["knobs"])):
            picks["baseline"] = base
        with sigterm_as_exception():
            noise = slo_search.remeasure(params, Path(outputs), picks, args.noise_check,
                                         obj, bounds, stored_only=args.stored_only)
        if tolerance is None and noise[0]["spread"] is not None:
            tolerance = noise[0]["spread"]  # the grid answer's own run-to-run spread
        text += f"""
## Run-to-run noise ({args.noise_check} repeats of each at its best level, one engine each)

Names: {', '.join(f"{n['name']} `{n['knobs']}`" for n in noise)}{
            " (the live search's pick is the baseline)" if s and "best" in s and base
            and s["best"]["knobs"] == base["knobs"] else ""}.

| config | users | {obj}: each repeat | mean | spread (max−min)/mean | repeats meeting the SLO |
|---|---|---|---|---|---|
""" + "\n".join(f"| {n['name']} | {n['users']} | {n['values']} | {n['mean']} | "
                f"{n['spread']} | {n['meets']}/{len(n['values'])} |" for n in noise) + "\n"
        named = {n["name"]: n for n in noise}
        if ("live search's pick" in named and named["grid's answer"]["mean"]
                and named["live search's pick"]["mean"]):
            pk, ga = named["live search's pick"], named["grid's answer"]
            c = slo_search.confirm_pick([pk, ga], args.noise_check)
            if c.get("within_noise"):
                verdict = "**within noise**: the gap is inside their run-to-run spread"
            elif c["pick"] == pk["knobs"]:
                verdict = "**ahead of it**: " + ("it meets the SLO more often"
                                                 if pk["meets"] > ga["meets"] else
                                                 "by more than the run-to-run spread")
            else:
                verdict = "**not within noise**: the grid's answer " + (
                    "meets the SLO more often" if ga["meets"] > pk["meets"]
                    else "is ahead by more than the run-to-run spread")
            text += (f"\nRe-measured side by side, the live search's pick serves "
                     f"{pk['mean'] / ga['mean']:.2f}× the grid's answer (means; SLO met "
                     f"{pk['meets']}/{len(pk['values'])} vs {ga['meets']}/{len(ga['values'])}): "
                     f"{verdict}.\n")
    tolerance = 0.05 if tolerance is None else tolerance
    reps: list[dict] = []
    missing = g.get("missing_configs") or []
    if missing:
        text += (f"\n**Not measured**: {missing} (the device budget ran out; `--stored-only` "
                 "rebuilt the grid from its stored points). The grid's answer and engine time are "
                 "over the configs measured: every \"÷ grid\" above divides by less than the "
                 "full grid's time. A replayed search that proposes a missing config gets "
                 "nothing from it, at no cost.\n")
    if args.replay:
        rspec = spec
        if spec.baseline and dict(spec.baseline) in missing:
            rspec = dataclasses.replace(spec, baseline=None)  # it cannot be tried first
            text += "\nThe baseline is not measured: the replays start without it.\n"
        reps = replay(g, rspec, bounds, args.replay, tolerance)
        n = len(reps)
        source = ("the grid answer's run-to-run spread above" if noise and args.tolerance is None
                  else "--tolerance")
        text += f"""
## The search replayed on the grid's points ({n} seeds)

Each replay asks the grid's measurements instead of an engine and is charged what each point
cost in the grid (its runs, plus its config's engine start once), so it shows the method's
answer and cost on the same numbers. "Within noise": the grid scores the pick within
{tolerance:.0%} of its best ({source}).

| {REPLAY_HEAD}
|---|---|---|---|---|---|---|
| {replay_cells(reps)}

{missing_note(reps)}"""
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text(text)
    report.with_suffix(".json").write_text(json.dumps(
        {"grid": g, "search": s, "replay": reps, "tolerance": tolerance,
         "live_stop": stops, "fast_start_grid": fast, **fractions,
         "noise": noise, "paired": paired}, indent=1,
        default=str))
    print(text)
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except Terminated as e:  # SIGTERM, or DeadlineNear before a start: stored points resume
        print(f"slo_bench: stopped ({e}); the same command resumes", file=sys.stderr)
        raise SystemExit(143) from None
