#!/usr/bin/env bash
# Run ON the device from the repo root, in calls back to back (the machine keeps /root while it
# stays warm): takes the carried slices of a file too big for one call, keeps them under
# /root/stash, and joins them once all are there and the sha256 matches.
#   Usage: bash scripts/h200_stash.sh DIR NAME
#   DIR holds slice-NN files and SHA256 (`sha256sum NAME`), made here with
#     sha256sum NAME > DIR/SHA256 && split -b 33000000 -d NAME DIR/slice-
#   The joined file lands at /root/stash/NAME; it prints its path when complete.
# The SmolLM2 GGUF (98 MB, barely compresses) travels this way: 3 slices beside what else the
# calls carry (64 MiB each), then TUNEBOOK_SMOLLM2_GGUF=/root/stash/<name> (scripts/h200_run.sh
# sets it when the file is there).
set -uo pipefail
dir=$1 name=$2 stash=/root/stash
mkdir -p "$stash/$name.parts"
if [[ -f "$stash/$name" ]]; then echo "STASHED: $stash/$name"; exit 0; fi
shopt -s nullglob
for s in "$dir"/slice-*; do cp -f "$s" "$stash/$name.parts/" && echo "kept $(basename "$s")"; done
[[ -f "$dir/SHA256" ]] && cp -f "$dir/SHA256" "$stash/$name.parts/SHA256"
want=$(cut -d' ' -f1 "$stash/$name.parts/SHA256" 2>/dev/null)
got=$(cat "$stash/$name.parts"/slice-* | sha256sum | cut -d' ' -f1)
if [[ -n "$want" && "$got" == "$want" ]]; then
  cat "$stash/$name.parts"/slice-* > "$stash/$name.tmp" && mv "$stash/$name.tmp" "$stash/$name"
  rm -rf "$stash/$name.parts"; echo "STASHED: $stash/$name"
else
  echo "have $(ls "$stash/$name.parts" | grep -c slice-) slice(s) of $name; not complete yet"
fi
