#!/usr/bin/env bash
# The death matrix (tests/measure/test_engine_deaths.py) with the non-engine suite looping beside
# it, RUNS times: a busy box, where starts and the client's import overlap (the way issue 44's
# in-flight import and stale-title bugs were found). Prints one line a run; logs in OUT.
#   scripts/deaths_under_load.sh [RUNS=3] [OUT=/tmp/deaths-under-load]
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-3}
OUT=${2:-/tmp/deaths-under-load}
rm -rf "$OUT" && mkdir -p "$OUT"
for i in $(seq 1 "$RUNS"); do
  ( while [ ! -f "$OUT/stop" ]; do
      .venv/bin/python -m pytest -q -m "not engine" tests/present tests/inputs -p no:cacheprovider \
        --basetemp="$OUT/beside" >/dev/null 2>&1
    done ) &
  beside=$!
  .venv/bin/python -m pytest -q -ra -s tests/measure/test_engine_deaths.py -p no:cacheprovider \
    --basetemp="$OUT/run$i" >"$OUT/run$i.log" 2>&1
  rc=$?
  touch "$OUT/stop"; wait "$beside"; rm -f "$OUT/stop"
  echo "run $i: exit $rc, $(grep -E 'passed|failed' "$OUT/run$i.log" | tail -1)"
done
