"""How the search's stopping rule trades engine time for the answer (issue 15), on stored grids.

Replays the search (benchmarks/slo_bench.replay) on the points a grid measured, for each
`budget.patience` and `budget.min_gain` given and each seed, and writes one table row per pair
(min_gain: what counts as beating the best, against noise): how often the
pick is the grid's config or within its noise, and the engine time it would have cost ÷ the
grid's. Starts no engine: it reads the grid summary that slo_bench wrote (benchmark.json).
A search spends at least baseline + random start + patience engine starts, so on a small
space (few configs, starts dominating) its floor is a large share of the grid; this shows it.

    .venv/bin/python benchmarks/slo_patience.py params/slo.yaml outputs/cpu/slo-bench
    .venv/bin/python benchmarks/slo_patience.py params/slo-h200.yaml outputs/h200/slo-bench
    .venv/bin/python benchmarks/slo_patience.py params/slo-h200-space3.yaml \
        outputs/h200/slo-space3-bench --min-gain 1 1.03 1.05
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from tunebook.inputs import params as P
from tunebook.inputs import slo

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from slo_bench import REPLAY_HEAD, replay, replay_cells  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("params", type=Path)
    ap.add_argument("folder", type=Path, help="slo_bench's --out folder (its benchmark.json)")
    ap.add_argument("--patience", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--min-gain", type=float, nargs="+", default=[1.0],
                    help="budget.min_gain values: a config resets patience only by beating "
                         "the best by this factor (1: any gain)")
    ap.add_argument("--seeds", type=int, default=50)
    args = ap.parse_args()
    params = P.load(args.params)
    bounds = slo.parse_slo(list(params.section(slo.SLO)))
    spec = slo.parse_search(params.section(slo.SEARCH), params.load.users)
    stored = json.loads((args.folder / "benchmark.json").read_text())
    grid, tolerance = stored["grid"], stored["tolerance"]
    missing = grid.get("missing_configs") or []
    if spec.baseline and dict(spec.baseline) in missing:
        spec = dataclasses.replace(spec, baseline=None)
    lines = [
        f"# The search's patience vs its cost, replayed on `{args.folder.as_posix()}`", "",
        f"Command: `python benchmarks/slo_patience.py {' '.join(sys.argv[1:])}`. Space: "
        f"{len(spec.grid())} engine configs ({len(spec.grid()) - len(missing)} measured) × "
        f"{len(spec.users)} load levels; random start {spec.startup} configs; baseline "
        f"{'tried first' if spec.baseline else 'not measured, so not tried'}. Within noise: "
        f"the grid scores the pick within {tolerance:.0%} of its best (as in benchmark.md). "
        f"{args.seeds} seeds per row.", "",
        f"| patience | min_gain | {REPLAY_HEAD}" + (" proposed a missing config |" if missing
                                                    else ""),
        "|---|---|---|---|---|---|---|---|---|" + ("---|" if missing else "")]
    for patience in args.patience:
        for min_gain in args.min_gain:
            reps = replay(grid, dataclasses.replace(spec, patience=patience, min_gain=min_gain),
                          bounds, args.seeds, tolerance)
            hit = sum(1 for r in reps if r.get("missing_touched"))
            lines.append(f"| {patience} | {min_gain:g} | {replay_cells(reps)}"
                         + (f" {hit}/{len(reps)} |" if missing else ""))
    if missing:
        lines += ["", "A replay that proposes a config the grid lacks gets nothing from it at "
                      "no cost: those replays' engine time reads low."]
    text = "\n".join(lines) + "\n"
    (args.folder / "patience.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
