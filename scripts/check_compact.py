"""Prove that converting the committed outputs lost nothing (issue 34's round-trip check).

    .venv/bin/python scripts/check_compact.py 6c87529            # every experiment under outputs/
    .venv/bin/python scripts/check_compact.py 6c87529 outputs/h200/ch04

Takes outputs/ as git commit BEFORE holds it (written inline: each run's per-request arrays
in its JSON, plain logs) and the working tree's outputs/ (compact), and checks:

- every run record of BEFORE reads back the same from the working tree (row, metadata and
  every per-request value, type by type: tunebook.results.compact.same), through the reader
  every figure, claim, resume and replot uses (compact.read_record);
- every engine log and block recording of BEFORE has the same bytes in the working tree
  (plain or gzipped, read through tunebook.core.files.read_stored);
- every chart an executed notebook of BEFORE drew is still there: the same Vega-Lite spec,
  and its SVG copy either kept as it was or dropped because the spec redraws it byte for byte;
- `tunebook claims` gives the same rows (verdict, measured text, rule) on both, for each
  machine folder checked whole (outputs/, or outputs/<machine>).

Records, logs and notebooks added after BEFORE are counted, not checked (nothing to compare).
Exit 0 when all hold; 1 with each difference listed.
"""

from __future__ import annotations

import argparse
import io
import json
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "lib"))

from tunebook.core.files import GZ, read_stored  # noqa: E402
from tunebook.present import claims, report  # noqa: E402
from tunebook.results import compact  # noqa: E402

LOG_DIRS = ("engines",)


def extract(commit: str, paths: list[str], into: Path) -> None:
    """outputs/ (or `paths` under it) as `commit` holds them, written under `into`."""
    tar = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit, *paths],
                         check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as t:
        t.extractall(into, filter="data")


def charts(ipynb: Path) -> list[tuple[dict, str | None]]:
    """(Vega-Lite spec, SVG copy or None) of each chart output, in order."""
    nb = json.loads(ipynb.read_text(encoding="utf-8"))
    return [(data[report.VEGALITE_MIME], report.svg_copy(data))
            for _, data in report.chart_outputs(nb)]


def check(before: Path, after: Path) -> tuple[dict[str, int], list[str]]:
    counts = {"records": 0, "request values": 0, "logs": 0, "log bytes": 0, "charts": 0,
              "svg redrawn": 0, "records added since": 0}
    problems: list[str] = []
    for old in sorted(before.glob("**/runs/*.json")):
        rel = old.relative_to(before)
        new = after / rel
        if not new.exists():
            problems.append(f"{rel}: missing now")
            continue
        a, b = compact.read_record(old), compact.read_record(new)
        if a is None or b is None or not compact.same(a, b):
            problems.append(f"{rel}: reads back different")
            continue
        counts["records"] += 1
        req = a.get("requests") if isinstance(a, dict) else None
        if isinstance(req, dict):
            counts["request values"] += sum(
                sum(len(x) if isinstance(x, list) else 1 for x in v)
                for v in req.values() if isinstance(v, list))
    counts["records added since"] = sum(
        1 for runs in before.glob("**/runs") for p in (after / runs.relative_to(before)).glob(
            "*.json") if not (runs / p.name).exists())
    for d in LOG_DIRS:
        for old in sorted(before.glob(f"**/{d}/*")):
            if not old.is_file() or old.name.startswith("."):
                continue
            rel = old.relative_to(before)
            plain = after / str(rel).removesuffix(GZ)
            try:
                same = read_stored(plain) == read_stored(old)
            except OSError as e:
                problems.append(f"{rel}: {e}")
                continue
            if not same:
                problems.append(f"{rel}: bytes differ")
                continue
            counts["logs"] += 1
            counts["log bytes"] += len(read_stored(old))
    for old in sorted(before.glob("**/notebooks/*.ipynb")):
        rel = old.relative_to(before)
        new = after / rel
        if not new.exists():
            if ".replot." not in old.name:  # a newer replot replaces an older one
                problems.append(f"{rel}: missing now")
            continue
        was, now = charts(old), charts(new)
        if len(was) != len(now):
            problems.append(f"{rel}: {len(was)} charts before, {len(now)} now")
            continue
        for i, ((spec0, svg0), (spec1, svg1)) in enumerate(zip(was, now, strict=True)):
            if not compact.same(spec0, spec1):
                problems.append(f"{rel}: chart {i + 1}'s spec differs")
            elif svg1 is None and svg0 is not None:
                redrawn = report._svg(spec1)
                if redrawn is None or not report.same_svg(redrawn, svg0):
                    problems.append(f"{rel}: chart {i + 1}'s SVG was dropped but its spec "
                                    "does not redraw it")
                else:
                    counts["svg redrawn"] += 1
            elif svg1 != svg0:
                problems.append(f"{rel}: chart {i + 1}'s SVG differs")
            counts["charts"] += 1
    return counts, problems


def claim_rows(root: Path, experiments: list[Path]) -> list[dict]:
    """The rows `tunebook claims` writes for these experiments under `root` (as JSON values,
    the root's path taken out)."""
    rows = claims.evaluate([root / e for e in experiments]).to_dict("records")
    return json.loads(json.dumps(rows, default=str).replace(str(root), "ROOT"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", help="a commit whose outputs/ were written inline")
    ap.add_argument("paths", nargs="*", default=["outputs"],
                    help="folders under outputs/ to check (default: all of outputs/)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        extract(args.before, args.paths, Path(tmp))
        counts, problems = check(Path(tmp) / "outputs", REPO / "outputs")
        # a figure may cite every experiment of a machine (chapter 7's symptoms): claims are
        # compared for machine folders checked whole
        whole = {Path(p).parts[1] for p in args.paths if len(Path(p).parts) == 2} | (
            {p.name for p in (Path(tmp) / "outputs").iterdir() if p.is_dir()}
            if any(Path(p).parts == ("outputs",) for p in args.paths) else set())
        for machine in sorted(whole):
            old_root = Path(tmp) / "outputs" / machine
            exps = [e.relative_to(old_root) for e in claims.experiments_under(old_root)]
            was = claim_rows(old_root, exps)
            now = claim_rows(REPO / "outputs" / machine, exps)
            counts[f"claims rows ({machine})"] = len(was)
            if was != now:
                problems.append(f"tunebook claims outputs/{machine}: rows differ")
    print(", ".join(f"{k}: {v:,}" for k, v in counts.items()))
    for p in problems:
        print(f"  DIFFERS {p}")
    print("round trip: " + ("every value, byte and chart equal" if not problems
                            else f"{len(problems)} differences"))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
