"""Do a sweep's rows match other sweeps' rows of the same runs? (issue 16: `--ray` vs local)

Joins an experiment's rows with each reference experiment's on the run id (a run id is the
engine config + load point + repeat, not the experiment, so the same run swept anywhere has the
same id) and writes each metric's ratio, this ÷ reference, with the reference's own
run-to-run spread where two references measured the same run (the noise to judge by).
Starts no engine; reads stored rows.

    .venv/bin/python benchmarks/ray_compare.py outputs/h200/ray-h200 \
        outputs/h200/slo-bench/slo-search outputs/h200/slo-bench/slo-grid \
        --out outputs/h200/ray-h200/compare.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from tunebook.results.store import Store, ok_rows

METRICS = ("output_tok_s", "p50_tpot_ms", "p99_tpot_ms", "p50_ttft_ms", "p99_ttft_ms")


def ok_by_run(folder: Path) -> dict[str, dict]:
    """An experiment's ok rows (the row Store.table keeps of each run), by run id."""
    return {r["run_id"]: r for r in ok_rows(Store(folder).table()).to_dict("records")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path)
    ap.add_argument("references", type=Path, nargs="+")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    mine = ok_by_run(args.experiment)
    refs = {r.as_posix(): ok_by_run(r) for r in args.references}
    head = " | ".join(f"{m} ÷ ref" for m in METRICS)
    lines = [f"# `{args.experiment.as_posix()}` against sweeps of the same runs", "",
             f"Command: `python benchmarks/ray_compare.py {' '.join(sys.argv[1:])}`. "
             "Same run id = same engine config, load point and repeat. Ratios are this "
             "sweep's row ÷ the reference's; rows are single runs, so read them against "
             "the references' own spread (last table).", "",
             f"| run id | host | reference | {head} |",
             "|---|---|---|" + "---|" * len(METRICS)]
    ratios: dict[str, list[float]] = {m: [] for m in METRICS}
    for rid, row in sorted(mine.items()):
        for name, ref in refs.items():
            if rid not in ref:
                continue
            cells = []
            for m in METRICS:
                a, b = row.get(m), ref[rid].get(m)
                r = a / b if a and b else None
                cells.append(f"{r:.3f}" if r else "–")
                if r and name == next(n for n, rr in refs.items() if rid in rr):
                    ratios[m].append(r)
            lines.append(f"| `{rid}` | {row.get('host')} | {name} | {' | '.join(cells)} |")
    lines += ["", "Median ratio over the runs (each against its first reference): "
              + ", ".join(f"{m} {statistics.median(v):.3f}" for m, v in ratios.items() if v)
              + ".", ""]
    spread = []
    names = list(refs)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            for rid in sorted(set(refs[a]) & set(refs[b])):
                spread.append(f"| `{rid}` | {a} ÷ {b} | " + " | ".join(
                    f"{refs[a][rid][m] / refs[b][rid][m]:.3f}"
                    if refs[a][rid].get(m) and refs[b][rid].get(m) else "–" for m in METRICS)
                    + " |")
    if spread:
        lines += ["The references' own spread (the same run measured by both, no Ray):", "",
                  f"| run id | ratio | {' | '.join(METRICS)} |",
                  "|---|---|" + "---|" * len(METRICS), *spread, ""]
    text = "\n".join(lines)
    if args.out:
        args.out.write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
