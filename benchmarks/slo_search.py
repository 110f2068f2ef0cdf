"""The SLO search against the full grid on the same space (issue 15). Not a test: one run each.

Runs the full grid (every engine config at every load level) into `<experiment>-grid` and the
search into `<experiment>-search` — separate experiments, so the search reuses none of the
grid's stored runs — then writes both answers, both engine times and the ratio.

    .venv/bin/python benchmarks/slo_search.py params/slo.yaml [--out docs/slo-search.md]
    # on the lent H200, through scripts/h200_run.sh:
    bash scripts/h200_run.sh '@560:bench slo_search.py params/slo-h200.yaml'

Engine time = seconds spent inside sweeps (engine starts, warm-ups, runs, stops). Both start
with empty compile caches (tunebook.compile_cache.clear), so neither inherits the other's.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))

from tunebook import compile_cache, config, hardware, slo, slo_search  # noqa: E402
from tunebook import params as P  # noqa: E402
from tunebook.store import stamp, write_new  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", type=Path)
    ap.add_argument("--outputs", type=Path, default=None)
    ap.add_argument("--kinds", nargs="+", choices=("grid", "search"),
                    default=["grid", "search"],
                    help="which to run now; the other's newest stored summary is reused "
                         "(e.g. rerun only the search after a change to it)")
    ap.add_argument("--out", type=Path, default=None,
                    help="markdown report (default: OUTPUTS/<experiment>-search/benchmark.md)")
    args = ap.parse_args()
    params = P.load(args.params)
    outputs = args.outputs or config.outputs_dir()
    bounds = slo.parse_slo(list(params.slo))
    spec = slo.parse_search(params.search, params.load.users)
    results = {}
    for kind in ("grid", "search"):
        p = dataclasses.replace(params, experiment=f"{params.experiment}-{kind}")
        if kind not in args.kinds:
            kept = slo_search.stored(outputs, p.experiment)
            if kept is None:
                ap.error(f"no stored {kind} under {Path(outputs) / p.experiment}: run it")
            results[kind] = kept
            continue
        ev = slo_search.SweepEvaluator(p, outputs, progress=True)
        if compile_cache.enabled():  # both start from empty compile caches: a fair race
            compile_cache.clear()
        t0 = time.monotonic()
        try:
            res = (slo.full_grid(ev, spec, bounds) if kind == "grid"
                   else slo.search(ev, spec, bounds))
        finally:
            ev.close()
        out = slo_search.summary(p, res, ev)
        out["wall_s"] = round(time.monotonic() - t0, 1)
        folder = Path(outputs) / p.experiment / "search"
        folder.mkdir(parents=True, exist_ok=True)
        write_new(folder / f"{stamp()}.json", json.dumps(out, indent=1, default=str).encode())
        results[kind] = out
        print(f"== {kind}: {slo_search.report_text(out)}", flush=True)
    g, s = results["grid"], results["search"]
    same = ("best" in g) == ("best" in s) and (
        "best" not in g or g["best"]["knobs"] == s["best"]["knobs"])
    m = hardware.machine()
    obj = spec.objective

    def answer(o: dict) -> str:
        if "best" not in o:
            return "none meets the SLO"
        b = o["best"]
        return f"`{b['knobs']}` at {b['users']} users, {b[obj]:,.1f} {obj}"

    rerun = ("" if len(args.kinds) == 2 else
             f"; this time only {args.kinds[0]} ran, the other is its newest stored summary")

    def row(name: str, o: dict) -> str:
        return (f"| {name} | {answer(o)} | {o['points']} | {o['engine_starts']} | "
                f"{o['engine_s']:.0f} |")

    text = f"""# SLO search vs the full grid

Command: `python benchmarks/slo_search.py {args.params}` (one run each{rerun}; {m['hardware']},
{m['vllm_package']}, Python {platform.python_version()}, tunebook {m['tunebook_commit']},
{time.strftime('%Y-%m-%d')}). SLO: {' and '.join(str(b) for b in bounds)}; objective {obj};
space: {len(spec.grid())} engine configs × {len(spec.users)} load levels.

| | answer | points run | engine starts | engine time s |
|---|---|---|---|---|
{row("full grid", g)}
{row(f"search ({spec.sampler})", s)}

**Same answer: {'yes' if same else 'no'}; search ÷ grid engine time =
{s['engine_s'] / max(g['engine_s'], 1e-9):.2f}** (stopped: {s['stopped']}).
"""
    if not same and "best" in g and "best" in s:
        # the grid's own measurement of the search's pick, to judge "within the noise"
        pick = next((c for c in g["configs"] if c["knobs"] == s["best"]["knobs"]), None)
        if pick is not None:
            text += (f"\nThe grid measured the search's pick at {pick['score'] or 0:,.1f} "
                     f"{obj} (its own best: {g['best'][obj]:,.1f}; "
                     f"{(pick['score'] or 0) / g['best'][obj]:.2f}×).\n")
    out_path = args.out or Path(outputs) / f"{params.experiment}-search" / "benchmark.md"
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
