"""`tunebook tune`: the SLO search (tunebook.search.adaptive) on real engines, through
tunebook.measure.sweep.

The search holds one sweep open (tunebook.measure.sweep.Sweep.open: checked, locked, its
stored runs read once) and hands it each point it asks for — one engine config at one load
level — as a plan of one run: stored as its JSON like every run, skipped when it is already
stored (so a search that was interrupted resumes where it stopped, and a second search of the
same space reuses every point), failures recorded with their diagnosis, a dead engine replaced
(the executor's loop). An EngineKeeper keeps the config's engine up while its load levels are
bisected, so a config costs one engine start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

import pandas as pd

from tunebook.core import schema
from tunebook.inputs import slo
from tunebook.inputs.params import SweepParams
from tunebook.inputs.plan import make_plan
from tunebook.measure.supply import EngineKeeper, run_seconds
from tunebook.measure.sweep import Sweep, SweepOptions, SweepSession
from tunebook.results import machines, stats
from tunebook.results.store import Store, latest_attempts, stamp, write_new
from tunebook.search import adaptive

EXIT_FOUND, EXIT_NONE = 0, 1
STATUS_MISSING = "missing"  # a point a stored-only evaluator has no run for


class SweepEvaluator:
    """(knobs, users) -> the stored row of that run, running it first when it is not stored.
    Counts what the search cost: engine starts and the seconds spent in sweeps."""

    def __init__(self, params: SweepParams, outputs: Path | str | None = None,
                 progress: bool = True, stored_only: bool = False):
        if not params.section(slo.SLO) or not params.section(slo.SEARCH):
            raise ValueError(f"{params.source}: no slo/search section: nothing to search")
        self.params = params
        self.outputs = machines.experiments_root(outputs, settle=False)  # its callers settle
        self.progress = progress
        self.stored_only = stored_only  # never start an engine: a point not stored is missing
        self.keeper = EngineKeeper()
        self.store = Store(self.outputs / params.experiment)  # where every point's run lands
        self.spent_s = 0.0  # seconds in sweeps in this process
        self.points_run = 0  # points that ran now (the rest were stored already)
        # point_key -> what the point cost, read from its stored rows (so a search resumed
        # after a kill, or rebuilt from a grid run over several device calls, counts it the
        # same): its runs' seconds (started_at to finished_at) and its engine's start
        self.costs: dict[str, dict[str, float]] = {}
        self.touched: list[str] = []  # the points this search asked for, in order
        self._open = contextlib.ExitStack()  # the sweep held open, from the first point run
        self._session: SweepSession | None = None

    def point_params(self, knobs: dict[str, Any], users: float) -> SweepParams:
        """One point: this engine config at this load level (users, or a trace's speed)."""
        p = self.params
        return dataclasses.replace(p, engine_grid=(dict(knobs),), parts=(),
                                   load=p.load.at_level(users))

    def session(self) -> SweepSession:
        """The search's sweep, opened once (its params and plan recorded then, the machine
        and the experiment locked until close)."""
        if self._session is None:
            sweep = Sweep(self.params, self.outputs, SweepOptions(
                progress=self.progress, keeper=self.keeper, rebuild_table=False))
            self._session = self._open.enter_context(sweep.open())
        return self._session

    def __call__(self, knobs: dict[str, Any], users: int) -> dict[str, Any]:
        params = self.point_params(knobs, users)
        plan = make_plan(params)
        key = slo.point_key(knobs, users)
        if not self.stored_only:
            session = self.session()
            t0 = time.monotonic()
            result = session.run(params, plan, session.sweep.resolve(plan))
            self.spent_s += time.monotonic() - t0
            self.points_run += result.ok + result.failed
        rows = self.store.latest_rows(r.run_id for r in plan.runs)
        if not rows and self.stored_only:
            return {"status": STATUS_MISSING, "error": "not measured (stored only)"}
        self.touched.append(key)
        if not rows:
            return {"status": schema.STATUS_FAILED, "error": "the run left no row"}
        self.costs[key] = point_cost(rows)
        return self._merge(rows)

    @staticmethod
    def _merge(rows: list[dict[str, Any]]) -> dict[str, Any]:
        bad = [r for r in rows if r.get("status") != schema.STATUS_OK]
        if bad:  # any repeat not ok: the point is not ok
            return bad[0]
        row = dict(rows[0])
        for col, v in rows[0].items():  # repeats: the mean of each measured number
            if len(rows) > 1 and isinstance(v, int | float) and not isinstance(v, bool):
                vals = [r.get(col) for r in rows]
                if all(isinstance(x, int | float) for x in vals):
                    row[col] = sum(vals) / len(vals)
        return row

    @property
    def engine_starts(self) -> int:
        """Engine configs the search's points needed (each costs one start when it runs)."""
        return len({k.rsplit("@", 1)[0] for k in self.touched})

    @property
    def engine_s(self) -> float:
        """What the search's points cost in engine time, from their rows: each config's engine
        start once, plus every point's runs (a point stored by an earlier, interrupted
        invocation counts what it cost then)."""
        starts: dict[str, float] = {}
        runs = 0.0
        for k in dict.fromkeys(self.touched):
            c = self.costs.get(k, {})
            starts.setdefault(k.rsplit("@", 1)[0], c.get("start_s", 0.0))
            runs += c.get("seconds", 0.0)
        return sum(starts.values()) + runs

    def close(self) -> None:
        """Close the sweep, stop the kept engine; rebuild the results table once for every
        point run."""
        try:
            self._open.close()
        finally:
            self._session = None
            self.keeper.stop()
        if self.store.runs_dir.is_dir() and not self.stored_only:
            self.store.rebuild_table()


def point_cost(rows: list[dict[str, Any]]) -> dict[str, float]:
    """A point's engine time from its stored rows: its runs (warm-ups and benchmark, every
    repeat) and the start of the engine that served it (charged once per config)."""
    start = next((float(r["startup_s"]) for r in rows
                  if isinstance(r.get("startup_s"), int | float)), 0.0)
    return {"seconds": round(sum(run_seconds(r) for r in rows), 2), "start_s": round(start, 2)}


def stored_progress(params: SweepParams, outputs: Path | str | None) -> str | None:
    """What a run of this search would resume from: the points (engine config, load) stored
    ok in its experiment, their engine configs, and their engine time (point_cost: the runs,
    plus each config's start once: its first, as a search that was never cut short would
    have paid; a config restarted by a resume has a second, often warm, start). None when
    nothing is stored."""
    store = Store(machines.experiments_root(outputs, settle=False) / params.experiment)
    points: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    ok = [r for r in latest_attempts(store.rows()) if r.get("status") == schema.STATUS_OK]
    level = "replay_speed" if params.load.search_levels()[1] == "speed" else "max_concurrency"
    for r in sorted(ok, key=lambda r: str(r.get("started_at"))):  # the row the search reads
        points.setdefault((r.get("engine_config_id"), r.get(level)), []).append(r)
    if not points:
        return None
    costs = {k: point_cost(rows) for k, rows in points.items()}
    starts: dict[Any, float] = {}
    for (cfg, _), c in costs.items():  # points in the order they first ran
        starts.setdefault(cfg, c["start_s"])
    engine_s = sum(starts.values()) + sum(c["seconds"] for c in costs.values())
    n, m = len(points), len(starts)
    return (f"  stored in {store.root.name}/: {n} point{'s' * (n != 1)} ok on {m} engine "
            f"config{'s' * (m != 1)}, {engine_s:,.0f} s of engine time; a run resumes from "
            "them (a point stored is never run again)")


def describe(params: SweepParams, outputs: Path | str | None = None) -> str:
    """The dry run of a search: the bounds, the space, what the full grid would cost, and
    (with `outputs`) what is stored already."""
    bounds = slo.parse_slo(list(params.section(slo.SLO)))
    spec = slo.parse_search(params.section(slo.SEARCH), *params.load.search_levels())
    grid = spec.grid()
    lines = [f"search {params.experiment}: maximise {spec.objective} subject to "
             + " and ".join(str(b) for b in bounds),
             f"  space: {len(grid)} engine configs × {len(spec.users)} load levels "
             f"({'replay speeds' if spec.level == 'speed' else 'users'} {list(spec.users)}) = "
             f"{len(grid) * len(spec.users)} points in the full grid",
             f"  sampler {spec.sampler} (seed {spec.seed}"
             + (f", {spec.startup} random configs first" if spec.sampler == "tpe" else "")
             + "); budget: "
             + (", ".join(x for x in (
                 f"{spec.max_configs} engine configs" if spec.max_configs else "",
                 f"{spec.max_minutes:g} minutes" if spec.max_minutes else "",
                 f"patience {spec.patience} (configs in a row that beat no best"
                 + (f" by {spec.min_gain:g}×" if spec.min_gain != 1.0 else "") + ")"
                 if spec.patience else "") if x)
                or "none (every config may be tried)")]
    if spec.baseline:
        lines.append(f"  baseline (tried first, the config to beat): {dict(spec.baseline)}")
    if spec.confirm:
        lines.append(f"  confirm: the answer and the runner-up measured {spec.confirm} more "
                     "times each at their load (one engine start each)")
    for name, values in spec.knobs.items():
        lines.append(f"  {name}: {list(values)}")
    if outputs is not None and (stored := stored_progress(params, outputs)):
        lines.append(stored)
    return "\n".join(lines)


def remeasure(params: SweepParams, outputs: Path, picks: dict[str, dict[str, Any]],
              repeats: int, objective: str, bounds: tuple[slo.Bound, ...],
              progress: bool = True, stored_only: bool = False) -> list[dict[str, Any]]:
    """Each pick (name -> {knobs, users}) measured `repeats` more times at its own best level,
    one engine start each, in `<experiment>-noise`: one draw per point is noisy, and the best
    of many noisy draws is biased up; the repeats say by how much, and whether the answer's
    lead over the runner-up is more than the run-to-run spread. `stored_only`: start nothing,
    read the repeats stored before (re-measured on a device, reported here); `engine_s` is
    then the stored runs' own time (no start: it is not stored per run)."""
    p0 = dataclasses.replace(params, experiment=f"{params.experiment}-noise", repeats=repeats,
                             parts=())
    out = []
    for name, pick in picks.items():
        p = dataclasses.replace(p0, engine_grid=(dict(pick["knobs"]),),
                                load=p0.load.at_level(pick["users"]))
        sweep = Sweep(p, outputs, SweepOptions(progress=progress))
        t0 = time.monotonic()
        if not stored_only:
            sweep.run()
        rows = sweep.store.latest_rows(r.run_id for r in sweep.plan.runs)
        ok = [r for r in rows if r.get("status") == schema.STATUS_OK
              and isinstance(r.get(objective), int | float)]
        vals = [float(r[objective]) for r in ok]
        mean = sum(vals) / len(vals) if vals else None
        out.append({"name": name, "knobs": pick["knobs"], "users": pick["users"],
                    "meets": sum(adaptive.meets(r, bounds) for r in ok),
                    "values": [round(v, 1) for v in vals],
                    "mean": round(mean, 1) if mean is not None else None,
                    "spread": round((max(vals) - min(vals)) / mean, 3)
                    if len(vals) > 1 and mean else None,
                    "engine_s": round(sum(run_seconds(r) for r in rows) if stored_only
                                      else time.monotonic() - t0, 1)})
    return out


def confirm_pick(measured: list[dict[str, Any]], repeats: int) -> dict[str, Any]:
    """Of the re-measured candidates (remeasure's rows, the search's answer first): the one
    that met the SLO in the most repeats, then the highest mean; and whether the answer's lead
    over the next is inside the run-to-run spread (then either is as good, and the answer
    stands)."""
    ranked = sorted(measured, key=lambda m: (m["meets"], m["mean"] or 0.0), reverse=True)
    top = ranked[0]
    out: dict[str, Any] = {"repeats": repeats, "candidates": measured, "pick": top["knobs"],
                           "users": top["users"], "mean": top["mean"],
                           "meets": f"{top['meets']}/{repeats}"}
    if len(ranked) > 1 and top["mean"] and ranked[1]["mean"]:
        gap = (top["mean"] - ranked[1]["mean"]) / top["mean"]
        noise = max(m["spread"] or 0.0 for m in ranked[:2])
        out["lead"] = round(gap, 3)
        out["within_noise"] = bool(top["meets"] == ranked[1]["meets"] and gap <= noise)
        if out["within_noise"]:  # no measurable difference: keep the search's own answer
            first = measured[0]
            out.update(pick=first["knobs"], users=first["users"], mean=first["mean"],
                       meets=f"{first['meets']}/{repeats}")
    return out


def gain_over_baseline(measured: list[dict[str, Any]], out: dict,
                       objective: str) -> dict[str, Any]:
    """The re-measured answers over the baseline (each at its own best level), as ratios with
    their 95% intervals from the repeats: the confirmed pick's ('vs_baseline') and, when the
    repeats did not confirm it, the search's own answer's ('search_vs_baseline'); {} when the
    baseline or the pick was not re-measured."""
    base_knobs = (out.get("baseline") or {}).get("knobs")
    base = next((m for m in measured if m["knobs"] == base_knobs),
                next((m for m in measured if m["name"] == "baseline"), None))
    pick = next((m for m in measured if m["knobs"] == out["confirm"]["pick"]), None)
    found = next((m for m in measured if m["name"] == "answer"), None)
    if base is None or pick is None:
        return {}

    def vs(m: dict[str, Any]) -> tuple[str, float] | None:
        a, b = stats.Interval.of(m.get("values") or []), stats.Interval.of(base["values"] or [])
        if a.n == 0 or b.n == 0 or not b.mean:
            return None
        if m is base:
            return "the answer is the baseline (vLLM's defaults here)", 1.0
        r = stats.ratio(a, b)
        return f"{r.text('x')} of the baseline's {objective}", round(r.mean, 3)

    out_: dict[str, Any] = {}
    if (g := vs(pick)) is not None:
        out_["vs_baseline"], out_["vs_baseline_mean"] = g
    if found is not None and found is not pick and (g := vs(found)) is not None:
        out_["search_vs_baseline"] = g[0]
    return out_


def paired_points(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any] | None:
    """Run-to-run noise at no extra engine time: the points (config, load level) that two
    summaries (a search and the grid) both measured, each on its own engine start. Per pair:
    a's objective ÷ b's, and whether the SLO verdict agrees. None when they share no point."""
    def measured(o: dict[str, Any]) -> dict[str, tuple[dict, dict]]:
        return {slo.point_key(c["knobs"], q["users"]): (c["knobs"], q)
                for c in o["configs"] for q in c["points"]
                if q.get("seconds") and q.get("value")}  # run, and gave a number
    ma, mb = measured(a), measured(b)
    pairs = [{"knobs": knobs, "users": qa["users"], "ratio": round(qa["value"] / qb["value"], 3),
              "meets": [bool(qa["meets"]), bool(qb["meets"])]}
             for k in sorted(ma.keys() & mb.keys())
             for (knobs, qa), (_, qb) in [(ma[k], mb[k])]]
    if not pairs:
        return None
    dev = [abs(p["ratio"] - 1.0) for p in pairs]
    flips = [p for p in pairs if p["meets"][0] != p["meets"][1]]
    return {"pairs": pairs, "n": len(pairs),
            "median_dev": round(statistics.median(dev), 3), "max_dev": round(max(dev), 3),
            "verdict_flips": flips}


def summary(params: SweepParams, result: adaptive.SearchResult, evaluator: SweepEvaluator) -> dict:
    """What `tunebook tune` prints and stores: the answer, how it was found, what it cost."""
    best = result.best
    out: dict[str, Any] = {
        "experiment": params.experiment, "slo": [str(b) for b in result.bounds],
        "level": result.spec.level,
        "search": result.spec.to_dict(), "stopped": result.stopped,
        "engine_starts": evaluator.engine_starts, "engine_s": round(evaluator.engine_s, 1),
        "engine_s_now": round(evaluator.spent_s, 1), "engine_starts_now": evaluator.keeper.starts,
        "points": len(result.points), "points_run_now": evaluator.points_run,
        "grid_points": len(result.spec.grid()) * len(result.spec.users),
        "configs": [{"knobs": o.knobs, "score": o.score, "pruned": o.pruned, "why": o.why,
                     "points": [{"users": p.users, "meets": p.meets, "value": p.value,
                                 **{b.metric: _num(p.row.get(b.metric))
                                    for b in result.bounds},
                                 **evaluator.costs.get(slo.point_key(p.knobs, p.users), {})}
                                for p in o.points]}
                    for o in result.outcomes],
    }
    if best is not None and best.best is not None:
        out["best"] = {"knobs": best.knobs, "users": best.best.users,
                       result.spec.objective: best.score,
                       "serve": adaptive.serve_command(params.model, params.engine, best.knobs),
                       **_what_it_costs(best.best.row)}
        base = result.baseline
        if base is not None:
            out["baseline"] = {"knobs": base.knobs, "pruned": base.pruned,
                               "users": base.best.users if base.best else None,
                               result.spec.objective: base.score}
            if base.score and not base.pruned:  # a pruned baseline's score is only a floor
                out["best"]["vs_baseline"] = round(best.score / base.score, 3)
    else:
        close = result.closest()
        if close is not None:
            out["closest"] = {"knobs": close.knobs, "users": close.users,
                              **{b.metric: _num(close.row.get(b.metric))
                                 for b in result.bounds}}
    return out


COST_KEYS = ("usd_per_hour", "usd_per_m_output_tok", "output_tok_per_usd",
             "energy_per_output_tok_j", "mean_power_w", "energy_note")


def _what_it_costs(row: Any) -> dict[str, Any]:
    """The answer's price and energy at its load level (the row's cost and energy columns)."""
    keep = {k: row.get(k) for k in COST_KEYS if hasattr(row, "get")}
    return {k: v for k, v in keep.items() if v is not None and not (isinstance(v, float)
                                                                    and math.isnan(v))}


def cost_text(b: dict[str, Any]) -> list[str]:
    """What the answer costs, in words: your price, the device's energy (or why not)."""
    lines = []
    if "usd_per_m_output_tok" in b:
        lines.append(f"  costs {b['usd_per_m_output_tok']:,.3f} USD per million output tokens "
                     f"at your price of {b['usd_per_hour']:,.2f} USD/h "
                     f"({b['output_tok_per_usd']:,.0f} output tokens per USD)")
    if "energy_per_output_tok_j" in b:
        lines.append(f"  uses {b['energy_per_output_tok_j']:.3f} J per output token "
                     f"(the GPUs at {b.get('mean_power_w', float('nan')):,.0f} W on average)")
    elif "energy_note" in b:
        lines.append(f"  energy: {b['energy_note']}")
    return lines


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else None


def tune(params: SweepParams, outputs: Path | str | None = None, progress: bool = True
         ) -> tuple[int, dict]:
    """Run the search; store its summary under <experiment>/search/ (never overwritten).
    Exit code: 0 a config meets the SLO, 1 none does (the summary names the closest)."""
    bounds = slo.parse_slo(list(params.section(slo.SLO)))
    spec = slo.parse_search(params.section(slo.SEARCH), *params.load.search_levels())
    evaluator = SweepEvaluator(params, outputs, progress)
    try:
        result = adaptive.search(evaluator, spec, bounds)
    finally:
        evaluator.close()
    out = summary(params, result, evaluator)
    if spec.confirm and "best" in out:  # is the answer's lead real? re-measure it and the next
        ranked = sorted((o for o in result.outcomes if o.score is not None and o.best),
                        key=lambda o: o.score or 0.0, reverse=True)[:2]
        picks = {name: {"knobs": o.knobs, "users": o.best.users}  # type: ignore[union-attr]
                 for name, o in zip(("answer", "runner-up"), ranked, strict=False)}
        base = result.baseline
        if (base is not None and base.best is not None
                and all(base.knobs != p["knobs"] for p in picks.values())):
            # the default, re-measured too: the answer's gain over it gets an interval
            picks["baseline"] = {"knobs": base.knobs, "users": base.best.users}
        measured = remeasure(params, evaluator.outputs, picks, spec.confirm, spec.objective,
                             bounds, progress)
        out["confirm"] = confirm_pick(measured, spec.confirm)
        out["confirm"].update(gain_over_baseline(measured, out, spec.objective))
        out["engine_s_confirm"] = round(sum(m["engine_s"] for m in measured), 1)
    folder = evaluator.outputs / params.experiment / "search"
    folder.mkdir(parents=True, exist_ok=True)
    write_new(folder / f"{stamp()}.json", json.dumps(out, indent=1, default=str).encode())
    return (EXIT_FOUND if "best" in out else EXIT_NONE), out


CLOSE_LEAD = 0.05  # a lead under this, one draw each, can be run-to-run noise (docs/slo-search.md)


def runner_up(out: dict) -> dict[str, Any] | None:
    """The config with the second-best score (from a summary's configs), its best point and
    how far behind the answer it is: the answer's lead is one draw against one draw."""
    best = out.get("best")
    scored = sorted((c for c in out.get("configs", []) if c.get("score") is not None),
                    key=lambda c: c["score"], reverse=True)
    if best is None or len(scored) < 2 or not scored[0]["score"]:
        return None
    c = scored[1] if scored[0]["knobs"] == best["knobs"] else scored[0]
    users = max((q for q in c["points"] if q.get("meets") and q.get("value") is not None),
                key=lambda q: q["value"], default={}).get("users")
    top = max(scored[0]["score"], c["score"])
    return {"knobs": c["knobs"], "users": users, "score": c["score"],
            "behind": round((top - c["score"]) / top, 4)}


def level_text(out: dict, level: Any) -> str:
    """A load level of a stored summary in words (summaries before traces: users)."""
    if level is None:
        return "no level"
    return f"{level:g}× the trace's rate" if out.get("level") == "speed" else f"{level} users"


def edges(out: dict) -> list[str]:
    """Where the answer sits on the edge of the space searched, and what to widen: at the
    highest load level (every level it tried met the SLO: a higher one may too), or at the
    first or last value of a numeric knob."""
    best, search = out.get("best"), out.get("search") or {}
    if not best:
        return []
    notes = []
    levels = search.get("speeds" if out.get("level") == "speed" else "users") or []
    key = "search.speeds" if out.get("level") == "speed" else "search.users"
    if levels and best.get("users") == max(levels):
        notes.append(f"the answer is at the highest load level searched "
                     f"({level_text(out, best['users'])}): the space may end before the SLO "
                     f"does; widen {key} upward")
    for name, values in (search.get("knobs") or {}).items():
        nums = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        v = best["knobs"].get(name)
        if len(nums) >= 2 and v in (min(nums), max(nums)) and len(values) == len(nums):
            side = "largest" if v == max(nums) else "smallest"
            notes.append(f"{name}={v} is the {side} value searched: widen search.knobs.{name} "
                         f"{'up' if side == 'largest' else 'down'}")
    return notes


def report_text(out: dict) -> str:
    lines = [f"slo: {' and '.join(out['slo'])}",
             f"search: {out['points']} points on {len(out['configs'])} engine configs "
             f"({out['engine_starts']} engine starts, {out['engine_s']:.0f} s in sweeps); the "
             f"full grid has {out['grid_points']} points; stopped: {out['stopped']}"]
    if "best" in out:
        b = out["best"]
        lines += [f"best: {b['knobs']} at {level_text(out, b['users'])}"
                  + (f", {b['vs_baseline']:.2f}× the baseline {out['baseline']['knobs']}"
                     if "vs_baseline" in b else ""),
                  f"  {b['serve']}", *cost_text(b)]
        c = out.get("confirm")
        r = runner_up(out)
        if r is not None and not c:
            lines.append(f"runner-up: {r['knobs']} at {level_text(out, r['users'])}, "
                         f"{r['behind']:.1%} "
                         "behind" + (f": one draw each, a lead under {CLOSE_LEAD:.0%} can be "
                                     "run-to-run noise (search.confirm: 3 re-measures both)"
                                     if r["behind"] < CLOSE_LEAD else ""))
        if c:
            values = next((m.get("values") for m in c.get("candidates", [])
                           if m["knobs"] == c["pick"]), None) or []
            mean = stats.Interval.of(values).text() if values else f"{c['mean']:,.1f}"
            found = next((m for m in c.get("candidates", []) if m.get("name") == "answer"),
                         None)
            if found is not None and found["knobs"] != c["pick"]:
                lines.append(f"not confirmed: the search's answer {found['knobs']} met the SLO "
                             f"in {found['meets']}/{c['repeats']} repeats at "
                             f"{level_text(out, found['users'])}"
                             + (f" ({c['search_vs_baseline']})"
                                if c.get("search_vs_baseline") else ""))
            lead = c.get("lead")
            lines.append(f"confirmed ({c['repeats']} repeats each, {out['engine_s_confirm']:.0f} s"
                         f"): {c['pick']} at {level_text(out, c['users'])}, mean "
                         f"{mean}, meets the SLO {c['meets']}"
                         + ("" if lead is None else
                            "; the runner-up is within the run-to-run noise" if c["within_noise"]
                            else f"; {lead:.1%} ahead of the runner-up" if lead >= 0
                            else f"; the runner-up serves {-lead:.1%} more but met the SLO "
                                 "in fewer repeats"))
            if c.get("vs_baseline"):
                lines.append(f"gain over the baseline: {c['vs_baseline']}")
        lines += [f"on the edge: {e}" for e in edges(out)]
    else:
        lines.append("no config meets the SLO")
        if "closest" in out:
            lines.append(f"closest: {out['closest']}")
    return "\n".join(lines)


def stored(outputs: Path | str | None, experiment: str) -> dict | None:
    """The newest stored search summary of an experiment (None: it never ran here)."""
    folder = machines.experiments_root(outputs, settle=False) / experiment / "search"
    files = sorted(folder.glob("*.json")) if folder.is_dir() else []
    return json.loads(files[-1].read_text()) if files else None


def configs_table(out: dict | None) -> pd.DataFrame:
    """One row per engine config the search tried: its score, how its search ended."""
    if not out:
        return pd.DataFrame()
    # a knob searched with `null` among its values: the engine's default, said so
    return pd.DataFrame([{**{k: "default" if v is None else v for k, v in c["knobs"].items()},
                          "score": c["score"], "points": len(c["points"]),
                          "pruned": c["pruned"], "why": c["why"]} for c in out["configs"]])
