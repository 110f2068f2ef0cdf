"""What no restructuring may change, held against a snapshot (tests/data/invariants.json, made
by `python scripts/invariants.py dump` before the package moved into folders): the run ids every
committed params file plans, what each still has to do against the committed outputs (complete
experiments: nothing), and the claims rows of outputs/cpu and outputs/h200 (figure, verdict and
measured text, row by row). When outputs change on purpose, dump the snapshot again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import invariants  # noqa: E402


def test_plans_and_claims_are_those_of_the_snapshot() -> None:
    snapshot = json.loads((REPO / "tests" / "data" / "invariants.json").read_text())
    now = invariants.dump()
    assert len(now["plans"]) >= 29 and {len(now["claims"][m]) for m in invariants.MACHINES}
    assert not invariants.differences(snapshot, now), "\n".join(
        invariants.differences(snapshot, now))
    assert now["plans"]["ch01.yaml"]["todo"]["cpu"] == []  # a complete experiment: nothing to do
