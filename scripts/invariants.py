"""What a restructuring must not change, as one JSON file: the run ids every committed params
file plans, what each plans still to do against the committed outputs, and the claims rows
(figure, verdict, measured text) of outputs/cpu and outputs/h200.

    python scripts/invariants.py dump before.json      # on the old commit
    python scripts/invariants.py dump after.json       # on the new one
    python scripts/invariants.py compare before.json after.json   # exit 1 on any difference

tests/test_invariants.py holds the committed outputs against the snapshot in
tests/data/invariants.json (regenerate it with `dump` when outputs change on purpose).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MACHINES = ("cpu", "h200")
CLAIM_COLUMNS = ("experiment", "figure", "verdict", "measured")


def planned(params_dir: Path = ROOT / "params") -> dict[str, Any]:
    """params file -> its run ids, and per machine the ids not yet stored ok there."""
    from tunebook.inputs.params import load
    from tunebook.inputs.plan import make_plan
    from tunebook.results.store import Store

    out: dict[str, Any] = {}
    for path in sorted(params_dir.glob("*.yaml")):
        params = load(path)
        ids = [r.run_id for r in make_plan(params).runs]
        todo = {}
        for machine in MACHINES:
            store = Store(ROOT / "outputs" / machine / params.experiment)
            if store.runs_dir.is_dir():
                todo[machine] = sorted(set(ids) - store.finished_run_ids())
        out[path.name] = {"run_ids": ids, "todo": todo}
    return out


def claim_rows(machine: str) -> list[dict[str, str]]:
    from tunebook.present import claims

    df = claims.evaluate(claims.experiments_under(ROOT / "outputs" / machine))
    return [{c: str(r[c]) for c in CLAIM_COLUMNS} for r in df.to_dict("records")]


def dump() -> dict[str, Any]:
    return {"plans": planned(), "claims": {m: claim_rows(m) for m in MACHINES}}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out = []
    for name in sorted(set(a["plans"]) | set(b["plans"])):
        if a["plans"].get(name) != b["plans"].get(name):
            out.append(f"params/{name}: planned runs or what is left to do differ")
    for machine in MACHINES:
        ra, rb = a["claims"].get(machine, []), b["claims"].get(machine, [])
        if len(ra) != len(rb):
            out.append(f"claims of outputs/{machine}: {len(ra)} rows before, {len(rb)} after")
        for x, y in zip(ra, rb, strict=False):
            if x != y:
                out.append(f"claims of outputs/{machine}: {x} became {y}")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("dump").add_argument("out", type=Path)
    cmp = sub.add_parser("compare")
    cmp.add_argument("before", type=Path)
    cmp.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "dump":
        args.out.write_text(json.dumps(dump(), indent=1, sort_keys=True) + "\n")
        return 0
    diff = differences(*(json.loads(p.read_text()) for p in (args.before, args.after)))
    for line in diff:
        print(line)
    print("identical" if not diff else f"{len(diff)} difference(s)")
    return 1 if diff else 0


if __name__ == "__main__":
    sys.exit(main())
