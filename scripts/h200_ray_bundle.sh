#!/usr/bin/env bash
# Ray for the lent H200 (no network there, 64 MiB a call): Ray 2.60's cp312 wheel (79 MB) made
# small enough to carry in one call (about 21 MB xz): Ray Core only, as `pip install ray` (no
# [default] extras) runs it: the Java jars, the dashboard's web client, and the Ray libraries
# tunebook does not use (data, train, tune, serve, rllib, llm) and every tests folder are cut;
# msgpack and protobuf ride along. scripts/h200_run.sh unpacks .carry/ray-*.tar.xz into
# /root/raysite once per machine and puts it on PYTHONPATH.
#   Usage: bash scripts/h200_ray_bundle.sh [.carry]   (then carry that folder in one call)
set -euo pipefail
out=$(realpath -m "${1:-.carry}")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q -d "$work/whl" --no-deps --python-version 3.12 --only-binary=:all: \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 ray==2.60.0 msgpack protobuf
mkdir -p "$work/site"
for w in "$work"/whl/*.whl; do (cd "$work/site" && unzip -q -o "$w"); done
cd "$work/site/ray"
rm -rf jars dashboard/client rllib data serve train tune llm
find . -name tests -type d -prune -exec rm -rf {} +
find . -name __pycache__ -type d -prune -exec rm -rf {} +
tar cf - -C "$work/site" . | xz -9e -T2 > "$work/ray-2.60.0-cp312.tar.xz"
mkdir -p "$out" && mv "$work/ray-2.60.0-cp312.tar.xz" "$out/"
ls -la "$out"/ray-*.tar.xz
