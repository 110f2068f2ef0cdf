#!/usr/bin/env bash
# Run tunebook on the lent H200 (device tool), from the repo root, after staging vLLM 0.26
# (see ../shared/device/README.md).
#   Usage: bash scripts/h200_run.sh run|sweep PARAMS [tunebook args...]
# Carry: .devstage/{install.sh,MANIFEST,part-01} and .whl (papermill/ipykernel/altair wheels).
# Everything lands in $OUT/h200.tgz (the device returns at most 8 files); unpack it into
# outputs/h200/ here and render the HTML with `tunebook render` (no nbconvert on the device).
set -uo pipefail
ready=$(bash .devstage/install.sh | tail -1)
[[ "$ready" == READY:* ]] || { echo "vLLM bundle not ready: $ready"; exit 1; }
eval "${ready#READY: }"
if [[ ! -d /tmp/site2/papermill ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site2 .whl/*.whl || exit 1
fi
export PYTHONPATH="$PYTHONPATH:/tmp/site2:$PWD/lib" PYTHONUNBUFFERED=1 TUNEBOOK_BATCH=1
export TUNEBOOK_STATE_DIR=/tmp/tunebook-state
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
dest=/tmp/tb-outputs
cmd=$1; shift
python3 -m tunebook.cli "$cmd" "$@" --outputs "$dest"; rc=$?
echo "tunebook exit code: $rc"
tar czf "$OUT/h200.tgz" --exclude=.lock -C "$dest" . && ls -la "$OUT"
exit $rc
