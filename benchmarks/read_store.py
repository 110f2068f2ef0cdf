"""Reading a store, inline against compact (issue 34): one committed experiment copied twice into
a temp folder, one copy converted as `tunebook compact` converts it (each record proven equal
first); then, in alternating rounds (the order flips each round, so drift and the page cache
favour neither), the wall time of

- `records`: every run record with its per-request arrays (`Store.records()`: what a replot's
  per-request figures and `record_of` read),
- `table`: the results table (`Store.table()`: rows only, as `rebuild_table` and resume read),
- `claims`: what `tunebook claims` reads and judges for it (`claims.evaluate`: its evidence,
  records without arrays, and the verdict of each figure its params target),

and the ratio of the medians, compact ÷ inline (below 1: compact reads faster). Starts no
engine; the committed experiment is only read. Where it is committed compact already, the
inline copy is the experiment as an older commit holds it (``--inline-from``: outputs/ were
inline at 6c87529), and the compact copy is the working tree's.

    .venv/bin/python benchmarks/read_store.py [EXPERIMENT] [--rounds 5] [--inline-from 6c87529]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from tunebook.present import claims
from tunebook.results import compact
from tunebook.results.store import Store

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import check_compact  # noqa: E402  (outputs/ as a commit held them)

DEFAULT = ROOT / "outputs" / "h200" / "slo-bench" / "slo-grid"  # 72 runs, 16 to 256 users


def folder_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


TASKS: dict[str, Callable[[Path], object]] = {
    "records": lambda root: sum(1 for _ in Store(root).records()),
    "table": lambda root: Store(root).table(),
    "claims": lambda root: claims.evaluate([root]),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("experiment", type=Path, nargs="?", default=DEFAULT)
    ap.add_argument("--rounds", type=int, default=5, help="timed rounds (at least 3)")
    ap.add_argument("--inline-from", metavar="COMMIT",
                    help="take the inline copy from this commit's outputs/ (git archive)")
    args = ap.parse_args()
    if args.rounds < 3:
        ap.error("--rounds: at least 3")
    exp = args.experiment.resolve()
    with tempfile.TemporaryDirectory(prefix="tunebook-read-store-") as tmp:
        forms = {form: Path(tmp) / form / exp.name for form in ("inline", "compact")}
        if args.inline_from:
            rel = exp.relative_to(ROOT)
            check_compact.extract(args.inline_from, [str(rel)], Path(tmp) / "git")
            shutil.move(Path(tmp) / "git" / rel, forms["inline"])
        else:
            shutil.copytree(exp, forms["inline"])
        shutil.copytree(exp, forms["compact"])
        if any(p.name.endswith(compact.REQUESTS_SUFFIX)
               for p in (forms["inline"] / "runs").iterdir()):
            ap.error(f"{exp} is stored compact already: name a commit that held it inline "
                     "(--inline-from 6c87529)")
        converted = compact.convert_experiment(forms["compact"])
        print(converted.text())
        assert not converted.problems, converted.problems
        same = compact.same(list(Store(forms["inline"]).records()),
                            list(Store(forms["compact"]).records()))
        print(f"records read the same from both forms: {same}")
        for form, root in forms.items():
            print(f"{form}: {folder_bytes(root / 'runs') / 1e6:.1f} MB in runs/, "
                  f"{folder_bytes(root) / 1e6:.1f} MB in all")
        for task in TASKS.values():  # warm-up: imports, the page cache
            for root in forms.values():
                task(root)
        times: dict[tuple[str, str], list[float]] = {}
        for i in range(args.rounds):
            order = list(forms.items()) if i % 2 == 0 else list(reversed(forms.items()))
            for name, task in TASKS.items():
                for form, root in order:
                    t0 = time.perf_counter()
                    task(root)
                    times.setdefault((name, form), []).append(time.perf_counter() - t0)
        print(f"\n{args.experiment} ({args.rounds} alternating rounds; median wall s)")
        print(f"{'read':<8} {'inline':>9} {'compact':>9}  compact/inline")
        for name in TASKS:
            a, b = (statistics.median(times[(name, f)]) for f in ("inline", "compact"))
            print(f"{name:<8} {a:>9.3f} {b:>9.3f}  {b / a:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
