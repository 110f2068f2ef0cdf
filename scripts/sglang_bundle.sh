#!/usr/bin/env bash
# Offline SGLang 0.5.17 for the lent H200 (Python 3.12, torch 2.11.0+cu130 in /opt/torch/.venv, no
# network, 64 MiB of files a call): SGLang's server path as xz parts of at most 55 MiB, to unpack
# into /root/sglsite. It rides ON TOP of the vLLM bundle (../shared/device/bundle, unpacked in
# /root/site): fastapi, starlette, uvicorn, pydantic(-core), anyio, pyzmq, msgspec, pybase64,
# partial-json-parser, setproctitle, watchfiles, llguidance, compressed-tensors, loguru, dill,
# jiter, sniffio come from there; what SGLang pins differently rides here and wins, because
# /root/sglsite comes first on PYTHONPATH (for the SGLang process only):
#   transformers 5.12.1 (device 5.17.0), tokenizers 0.22.2 (device 0.23.2; transformers 5.12.1
#   checks tokenizers<=0.23.0 at import), openai 2.6.1 (vLLM bundle 3.57.0), openai-harmony 0.0.4
#   (0.0.8), xgrammar 0.2.1 (0.2.7), apache-tvm-ffi 0.1.11 (0.1.10).
#
#   bash scripts/sglang_bundle.sh [OUTDIR]        # OUTDIR defaults to ./.devstage-sglang
#
# Writes two variants (VARIANTS="fa3 triton" by default):
#   OUTDIR/         fa3:    sgl-kernel's FA3 (flash_ops.abi3.so, SGLang's default attention on
#                           Hopper) included: 3 parts
#   OUTDIR/triton/  triton: no flash_ops; start the server with --attention-backend triton: 1 part
# each with part-NN, MANIFEST (sha256 of every part and of the whole stream) and install.sh.
#
# On the device (stage the vLLM bundle first, README in ../shared/device; all calls back to back,
# the machine goes back after ~30 s idle), one call per part:
#   run(command="bash .devstage-sglang/install.sh",
#       carry=[".devstage-sglang/install.sh", ".devstage-sglang/MANIFEST", ".devstage-sglang/part-00"])
#   ... part-01, then with the last part:
#   run(command="bash .devstage-sglang/install.sh && <your command>",
#       carry=[".devstage-sglang/install.sh", ".devstage-sglang/MANIFEST", ".devstage-sglang/part-02"])
# (triton: the same with .devstage-sglang/triton/…, a single call.) The call that completes the set
# unpacks into /root/sglsite, imports SGLang's server modules once and prints
#   READY: export PYTHONPATH=/root/sglsite:/root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1
# Use that environment for the SGLang process only (vLLM must keep PYTHONPATH=/root/site), e.g.
#   env PYTHONPATH=/root/sglsite:/root/site HF_HUB_OFFLINE=1 ... python3 -m sglang.launch_server …
# There is no `sglang` console script: `python3 -m sglang.launch_server`, `python3 -m
# sglang.bench_serving`. Later calls start with `bash .devstage-sglang/install.sh` (carrying only
# install.sh + MANIFEST): it prints READY at once while /root/sglsite is there.
#
# What is cut (the dense-model server path on Hopper does not import it; checked by importing 665
# sglang.srt modules here, CPU only, torch 2.11.0+cu130, with torch.cuda faked as one SM90 device):
#   sgl_kernel/sm100/ (Blackwell build; SM90 loads sgl_kernel/sm90/common_ops), flashmla_ops (MLA
#   models, guarded import), infllm_ops (MiniCPM4 sparse attention, lazy), flash_ops in the triton
#   variant; sglang/multimodal_gen (diffusion; guarded import); SGLang's three Rust extensions
#   (sglang/srt/{grpc,server,multimodal}/_core*.so: --grpc-port, SGLANG_RUST_SERVER=1, Inkling's
#   Rust image preprocessing) - they are the only files that need glibc 2.34, so the rest needs at
#   most the GLIBC_MAX the MANIFEST records; xgrammar's static libxgrammar.a (C++ builds only) and
#   the DWARF debug sections of libxgrammar_bindings.so (strip --strip-debug: 51 -> 3 MB, code
#   untouched); console scripts, __pycache__, pip's direct_url.json.
# Not bundled though sglang 0.5.17 lists them (each only on a path a dense model on an H200 does
# not take, or present on the device): see OMITTED below.
# IPython: sglang/utils.py imports IPython.display at import time (notebook helpers); a 20-line
# stub (HTML, display, get_ipython() -> None) stands in for IPython and its dependencies (jedi,
# parso, prompt_toolkit, traitlets, ...).
# At run time SGLang JIT-compiles some CUDA kernels (rotary embedding, ...; sglang/kernels/jit,
# flashinfer's headers) and flashinfer its sampling kernels with the device's nvcc at first use,
# cached in /root/.cache/tvm-ffi and /root/.cache/flashinfer while the machine stays warm;
# `--sampling-backend pytorch` avoids flashinfer's JIT.
#
# Env knobs:
#   WORKDIR=/tmp/sglang-bundle-build   scratch (wheels, staged site, xz streams; reused on reruns)
#   VARIANTS="fa3 triton"   which to write (fa3 -> OUTDIR, triton -> OUTDIR/triton)
#   PART_SIZE=55M           split size
#   XZ="xz -9e -T1"         compressor (one thread: the build machine's other core is busy)
#   PY=python3              interpreter whose pip downloads (any version; the wheels are cp312)
#   ALLOW_NEW_WHEELS=1      accept wheels whose sha256 differs from the pinned ones below
# Reproducible: pinned wheel hashes, no .pyc, tar --sort=name with fixed owner/mode/mtime, xz -T1;
# the same inputs give the same parts (byte for byte) and the same MANIFEST.
# Cost here (2 cores, 1 used): ~0.5 GB download, 12 min in all from scratch (xz: ~9 min for
# flash_ops, 1.12 GB -> 130 MB; ~2 min for the rest, 0.25 GB -> 36 MB). Built 2026-12-04:
# fa3 3 parts, 165,876,692 bytes; triton 1 part, 35,826,824 bytes; a rebuild in another WORKDIR
# gave the same bytes.
set -euo pipefail

OUT="$(realpath -m "${1:-.devstage-sglang}")"
WORKDIR="${WORKDIR:-/tmp/sglang-bundle-build}"
VARIANTS="${VARIANTS:-fa3 triton}"
PART_SIZE="${PART_SIZE:-55M}"
XZ="${XZ:-xz -9e -T1}"
PY="${PY:-python3}"
NICE="nice -n 10"
MTIME="@1767225600"   # 2026-01-01T00:00:00Z, every tar member

# name==version  sha256 of the wheel the index served (checked after download)
PKGS=(
  "sglang==0.5.17                  fb4cba478a5dca5ee146550b39f33add1c4e475d21ee11810b86ed1c58068093"
  "sglang-kernel==0.4.5            5927a14dfff92ced8b1f7c7d5844144bc574ec58e604d4fd53e6f53c709003a8"
  "flashinfer-python==0.6.15.post1 f2419fd2b77c2705816e8d0a31c784c6456b17f373f8494b5cfc3bdf434d5c44"
  "transformers==5.12.1            2a5e109d2021265df7098ffbb738295acaf5ad256f12cbc586db2ea4dcbb1a8a"
  "tokenizers==0.22.2              369cc9fc8cc10cb24143873a0d95438bb8ee257bb80c71989e3ee290e8d72c67"
  "xgrammar==0.2.1                 cbc6014dc1c92fc317b14519121c8163fe35fd934179e5a45d83f780ff231826"
  "apache-tvm-ffi==0.1.11          2843f084cdc94dedacd8b257a395a2b71b8a3dc7fc99711b148bf1d161983128"
  "openai==2.6.1                   904e4b5254a8416746a2f05649594fa41b19d799843cd134dac86167e094edef"
  "openai-harmony==0.0.4           31e9bcac0902a309e2fc688e52f247eec7fffcd00d17e958b9a83a8fea6519c2"
  "distro==1.9.0                   7bffd925d65168f85027d8da9af6bddab658135b840670a223589bc0c8ef02b2"
  "orjson==3.13.0                  bceadfd314bd238f584fc229a4bbaf0e573597e7a026dec5429fbf29fd66c641"
  "gguf==0.19.0                    70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd"
  "python-multipart==0.0.34        ebacd224bd686eee2f9aa1066a657affe07435a185834e05e5235e2e59173e91"
  "jsonschema==4.26.0              d489f15263b8d200f8387e64b4c3a75f06629559fb73deb8fdfb525f2dab50ce"
  "jsonschema-specifications==2025.9.1 98802fee3a11ee76ecaca44429fda8a41bff98b00a0f2838151b113f210cc6fe"
  "referencing==0.37.0             381329a9f99628c9069361716891d34ad94af76e461dcb0335825aecc7692231"
  "rpds-py==2026.9.1               addeda51556dac7c1a2f14cda62db8b621cd12afba3091d03a96c72932387eab"
  "soundfile==0.13.1               03267c4e493315294834a0870f31dbb3b28a95561b80b134f0bd3cf2d5f0e618"
  "cffi==2.1.1                     c1453022f490d2459a11819d83ad1d586e9ff65a12ac3e705ffebd46d3685dcf"
  "pycparser==3.12                 a076f3f489b39b43ed13563a1dafe42447445bec2e294154ec5c57fcdda4c85e"
  "datasets==5.2.0                 4be9e2882caaf5db13eadc39e93f3da2a995187b99acebac1595bf6c58dfa927"
  "multiprocess==0.70.19           3a56c0e85dd5025161bac5ce138dcac1e49174c7d8e74596537e729fd5c53c28"
)
# Why each is here (module-level imports on the server path unless said):
#   orjson (sglang.srt.utils.common), gguf (model_config -> gguf loader), python-multipart (fastapi
#   Form routes in http_server), jsonschema + specifications/referencing/rpds-py (serving_chat),
#   soundfile + cffi/pycparser (realtime/transcription routes), distro (openai), datasets +
#   multiprocess (sglang.bench_serving / bench_one_batch_server: the benchmark client only).

# Requires-Dist of the bundled wheels that are deliberately NOT bundled (name: why). Anything a
# wheel requires that is neither bundled, in the vLLM bundle, on the device, nor listed here stops
# the build (see the check below).
OMITTED='
anthropic: SGLang has its own Anthropic protocol models; the package is never imported
blobfile: Azure connector only
build: packaging tool
cuda-python: metapackage; the device has cuda-bindings, cuda-core, cuda-pathfinder
cuda-tile: flashinfer cuTile kernels (Blackwell); not on the sampling/JIT path
easydict: not imported by sglang.srt
flash-attn-4: FA4 (CuTe DSL) for SM100; Hopper uses sgl-kernel FA3
helion: Inkling MoE kernels
humming-kernels: humming quantization only
interegular: outlines grammar backend only (default is xgrammar)
ipython: replaced by a stub (sglang/utils.py imports IPython.display for notebooks)
kernels: HF kernel hub download of FA3; default SGLANG_USE_SGL_FA3_KERNEL=1 uses sgl-kernel
mistral-common: Mistral tokenizer mode / voxtral
modelscope: only with SGLANG_USE_MODELSCOPE=1
nccl4py: flashinfer comm kernels (multi-GPU fusions)
nvidia-cudnn-frontend: flashinfer cuDNN paths (not used by SGLang on Hopper dense)
nvidia-cutlass-dsl: CuTe-DSL kernels (GDN/KDA linear attention, SM100 MoE/GEMM, FA4); large MLIR libraries
nvidia-mathdx: JIT header dependency of the LPLB solver (EPLB) only
outlines: outlines grammar backend only
py-spy: profiler binary
quack-kernels: CuTe-DSL kernels (FA4 / SM100)
sgl-deep-gemm: DeepGEMM (FP8 block GEMM JIT); without it SGLang uses its CUTLASS/Triton FP8 path
smg-grpc-servicer: --smg-grpc-mode only
tilelang: DSA/NSA (DeepSeek V3.2) kernels
tokenspeed-mla: MLA attention backend
torch-memory-saver: --enable-memory-saver only
torchao: --torchao-config only
torchcodec: video/audio multimodal inputs
zstandard: request decompression middleware (SGLANG_ENABLE_REQUEST_DECOMPRESSION=1) only
'
# The vLLM bundle (../shared/device/build.sh PKGS, unpacked in /root/site) and the device's own
# packages (/opt/torch/.venv; .library/device/KINDS.md, read 2026-11-17): names, and the versions
# a session's pip list there showed (DEVICE_VERSIONS; the others are not known here).
VLLM_BUNDLE='vllm==0.26.0 fastapi==0.136.3 starlette==1.10.0 uvicorn==0.55.0 httptools==0.9.0 pydantic==2.14.4
pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 typing-extensions==4.16.0 anyio==4.16.0
idna==3.20 prometheus-fastapi-instrumentator==8.1.0 watchfiles==1.3.0 model-hosting-container-standards==0.1.16
jmespath==1.1.0 openai==3.57.0 httpx2==2.16.2 httpcore2==2.16.2 truststore==0.10.5 jiter==0.19.0 sniffio==1.3.1
openai-harmony==0.0.8 pyzmq==27.3.0 msgspec==0.23.0 cbor2==6.3.0 cachetools==8.0.2 pybase64==1.5.1
partial-json-parser==0.2.1.1.post7 setproctitle==1.3.8 llguidance==1.7.6 xgrammar==0.2.7 apache-tvm-ffi==0.1.10
compressed-tensors==0.17.0 loguru==0.7.3 depyf==0.20.0 astor==0.8.1 dill==0.4.1'
DEVICE='absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings cuda-core
cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils execnet filelock
flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet httpcore httpx
huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib
jaxtyping jinja2 joblib kiwisolver lazy-loader lightning lightning-utilities linear-operator lineax
llvmlite lxml markdown markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack
multidict multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript
opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas
pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache protobuf psutil pyarrow
pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov
pytest-mock pytest-timeout pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich
sacrebleu safetensors scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece
sentence-transformers setuptools shellingham simplejson six sortedcontainers statsmodels sympy tabulate
tensorboard tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz
torch torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton
typer typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash
yarl zipp'
DEVICE_VERSIONS='accelerate==1.15.0 huggingface-hub==1.33.0 numpy==2.5.2 safetensors==0.8.0 sentencepiece==0.2.2
tiktoken==0.14.0 tokenizers==0.23.2 torch==2.11.0 torchaudio==2.11.0 torchvision==0.26.0 transformers==5.17.0
triton==3.6.0'

PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp
      --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64
      --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64 --platform manylinux_2_24_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)

t0=$(date +%s)
WHL="$WORKDIR/wheels"; SITE="$WORKDIR/site"
mkdir -p "$WHL"

echo "== downloading wheels into $WHL"
wheels=()
for entry in "${PKGS[@]}"; do
  read -r spec sha <<<"$entry"
  name="${spec%%==*}"; ver="${spec##*==}"; norm="$(echo "$name" | tr 'A-Z-' 'a-z_')"
  f="$(ls "$WHL" 2>/dev/null | grep -i "^${norm}-${ver}-.*\.whl$" | head -1 || true)"
  if [[ -z "$f" ]]; then
    $NICE "$PY" -m pip download -q --no-deps "${PLAT[@]}" -d "$WHL" "$spec" 2>&1 | grep -vi "is ignored" || true
    f="$(ls "$WHL" | grep -i "^${norm}-${ver}-.*\.whl$" | head -1 || true)"
    [[ -n "$f" ]] || { echo "MISSING on the index: $spec" >&2; exit 1; }
  fi
  got="$(sha256sum "$WHL/$f" | cut -d' ' -f1)"
  if [[ "$got" != "$sha" ]]; then
    echo "sha256 of $f is $got, pinned $sha" >&2
    [[ "${ALLOW_NEW_WHEELS:-0}" == 1 ]] || exit 1
  fi
  wheels+=("$WHL/$f")
done

echo "== checking every Requires-Dist of the bundled wheels"
OMITTED="$OMITTED" VLLM_BUNDLE="$VLLM_BUNDLE" DEVICE="$DEVICE" DEVICE_VERSIONS="$DEVICE_VERSIONS" "$PY" - "${wheels[@]}" <<'PYCHECK'
import os, re, sys, zipfile
from email.parser import Parser
def canon(n): return re.sub(r"[-_.]+", "-", n).lower()
bundled = {}
for w in sys.argv[1:]:
    with zipfile.ZipFile(w) as z:
        meta = Parser().parsestr(z.read([n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]).decode())
    bundled[canon(meta["Name"])] = (meta["Version"], meta.get_all("Requires-Dist") or [])
omitted = {canon(l.split(":")[0]) for l in os.environ["OMITTED"].strip().splitlines()}
vllm = {canon(x.split("==")[0]): x.split("==")[1] for x in os.environ["VLLM_BUNDLE"].split()}
device = {canon(x) for x in os.environ["DEVICE"].split()}
devver = {canon(x.split("==")[0]): x.split("==")[1] for x in os.environ["DEVICE_VERSIONS"].split()}
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
env = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux",
       "platform_system": "Linux", "platform_machine": "x86_64", "implementation_name": "cpython",
       "os_name": "posix", "platform_python_implementation": "CPython", "extra": ""}
bad = 0
for name, (ver, reqs) in sorted(bundled.items()):
    for r in reqs:
        req = Requirement(r)
        if req.marker and not req.marker.evaluate(env):
            continue
        n = canon(req.name)
        if n in bundled:
            have = bundled[n][0]
            ok = not req.specifier or req.specifier.contains(have, prereleases=True)
            where = f"bundled {have}" + ("" if ok else "  <-- CONFLICT")
            bad += not ok
        elif n in vllm:
            ok = not req.specifier or req.specifier.contains(vllm[n], prereleases=True)
            where = f"vLLM bundle {vllm[n]}" + ("" if ok else "  <-- CONFLICT")
            bad += not ok
        elif n in device:
            if n in devver and req.specifier and not req.specifier.contains(devver[n], prereleases=True):
                where = f"device {devver[n]}  <-- CONFLICT"; bad += 1
            else:
                where = f"device {devver.get(n, '(version not known here)')}"
        elif n in omitted: where = "omitted"
        else: where = "UNCOVERED"; bad += 1
        if where not in ("omitted",) or os.environ.get("VERBOSE"):
            print(f"  {name}=={ver} -> {req}: {where}")
if bad:
    sys.exit(f"{bad} requirement(s) neither bundled, in the vLLM bundle, on the device nor OMITTED")
print(f"  {len(bundled)} wheels; every requirement covered (omitted ones: see OMITTED)")
PYCHECK

echo "== installing into $SITE (no deps, no .pyc)"
rm -rf "$SITE"; mkdir -p "$SITE"
$NICE "$PY" -m pip install -q --no-index --no-deps --no-compile "${PLAT[@]}" --target "$SITE" "${wheels[@]}" \
  2>&1 | grep -v "Target directory\|is ignored" || true

echo "== trimming"
K="$SITE/sgl_kernel"; S="$SITE/sglang"
rm -rf "$K/sm100"                                  # Blackwell build; SM90 loads sgl_kernel/sm90/common_ops
rm -f  "$K/flashmla_ops.abi3.so"                   # FlashMLA (MLA models); import in try/except
rm -f  "$K"/infllm_ops*.so                         # InfLLM-v2 (MiniCPM4); lazy loader
rm -rf "$S/multimodal_gen"                         # diffusion; `sglang serve` guards the import
rm -f  "$S"/srt/grpc/_core*.so "$S"/srt/server/_core*.so "$S"/srt/multimodal/_core*.so  # Rust (glibc 2.34)
rm -f  "$SITE/xgrammar/lib/libxgrammar.a"          # static lib for C++ builds
strip --strip-debug "$SITE/xgrammar/libxgrammar_bindings.so"   # DWARF only
rm -rf "$SITE/bin" "$SITE/tools" "$SITE/build_backend.py" "$SITE/build_utils.py"
find "$SITE" -name '__pycache__' -type d -prune -exec rm -rf {} +
find "$SITE" -path '*.dist-info/direct_url.json' -delete     # holds this machine's wheel path ...
sed -i '/\.dist-info\/direct_url\.json,/d' "$SITE"/*.dist-info/RECORD   # ... and so did its RECORD line

echo "== IPython stub"
mkdir -p "$SITE/IPython"
cat > "$SITE/IPython/__init__.py" <<'EOF'
"""Minimal stand-in for IPython, shipped by the offline SGLang bundle (scripts/sglang_bundle.sh).

sglang/utils.py does `from IPython.display import HTML, display` at import time (notebook helpers
only). The real IPython (+ jedi, parso, prompt_toolkit, traitlets, ...) is not needed to serve, so
this stub provides just those names. get_ipython() returns None = "not inside IPython", which is
what transformers/tqdm/loguru expect outside a notebook.
"""
__version__ = "0.0.0+sglang-bundle-stub"


def get_ipython():
    return None
EOF
cat > "$SITE/IPython/display.py" <<'EOF'
"""Stub of IPython.display for the offline SGLang bundle: HTML() keeps its text, display() prints."""


class HTML:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def __repr__(self):
        return str(self.data)

    def _repr_html_(self):
        return self.data


def display(*objs, **kwargs):
    for o in objs:
        print(o)
EOF

for f in "$K/sm90/common_ops.abi3.so" "$K/flash_ops.abi3.so" "$K/spatial_ops.abi3.so" \
         "$SITE/flashinfer/data/cutlass/include" "$SITE/tvm_ffi/include" "$S/kernels/jit/csrc" \
         "$SITE/sglang-0.5.17.dist-info/METADATA" "$SITE/transformers-5.12.1.dist-info/METADATA"; do
  [[ -e "$f" ]] || { echo "MISSING after trim: $f" >&2; exit 1; }
done
chmod -R u+rwX,go+rX,go-w "$SITE"

# glibc / libstdc++ symbol versions the kept shared objects need (the device's are not known here)
GLIBC_MAX=$(find "$SITE" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null | grep -o 'GLIBC_[0-9.]*' | sort -uV | tail -1)
GLIBCXX_MAX=$(find "$SITE" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null | grep -o 'GLIBCXX_[0-9.]*' | sort -uV | tail -1)
CXXABI_MAX=$(find "$SITE" -name '*.so*' -type f -exec objdump -T {} + 2>/dev/null | grep -o 'CXXABI_[0-9.]*' | sort -uV | tail -1)
echo "   needs at most $GLIBC_MAX, $GLIBCXX_MAX, $CXXABI_MAX"
du -sh "$SITE"

# One xz stream without flash_ops (the triton variant) and one with flash_ops alone; the fa3
# variant is the two streams back to back (xz -d reads concatenated streams; tar -x -i reads past
# the first archive's end). Each stream is cached under WORKDIR by a digest of its input files.
TARFLAGS=(--owner=0 --group=0 --numeric-owner --sort=name --format=gnu --mtime="$MTIME" --mode=u+rwX,go+rX,go-w)
FA="./sgl_kernel/flash_ops.abi3.so"
digest() { (cd "$SITE" && if [[ "$1" == base ]]; then find . -path "$FA" -prune -o \( -type f -o -type l \) -print; else echo "$FA"; fi \
            | LC_ALL=C sort | while read -r f; do printf '%s %s\n' "$f" "$(sha256sum < "$f" | cut -c1-64)"; done \
            | { cat; echo "$XZ ${TARFLAGS[*]}"; } | sha256sum | cut -c1-64); }
pack() {  # pack base|fa3
  local out="$WORKDIR/$1.tar.xz" d; d="$(digest "$1")"
  if [[ -f "$out" && "$(cat "$out.digest" 2>/dev/null)" == "$d" ]]; then echo "   $1 stream unchanged, reused"; return; fi
  local t=$(date +%s)
  if [[ "$1" == base ]]; then
    tar -C "$SITE" "${TARFLAGS[@]}" --exclude="$FA" -cf - . | $NICE $XZ -c > "$out.tmp"
  else
    tar -C "$SITE" "${TARFLAGS[@]}" -cf - "$FA" | $NICE $XZ -c > "$out.tmp"
  fi
  mv "$out.tmp" "$out"; echo "$d" > "$out.digest"
  echo "   $1 stream: $(stat -c%s "$out") bytes xz in $(( $(date +%s) - t )) s"
}
echo "== packing ($XZ)"
pack base
[[ " $VARIANTS " == *" fa3 "* ]] && pack fa3

write_variant() {  # write_variant NAME DIR STREAMS...
  local name="$1" dir="$2"; shift 2
  local bundle="sglang-0.5.17-h200-cp312-$name"
  mkdir -p "$dir"; rm -f "$dir"/part-* "$dir/MANIFEST" "$dir/install.sh"
  cat "$@" | split -b "$PART_SIZE" -d -a 2 - "$dir/part-"
  local n total sha unpacked
  n=$(ls "$dir"/part-* | wc -l); total=$(cat "$@" | wc -c); sha=$(cat "$@" | sha256sum | cut -c1-64)
  if [[ "$name" == fa3 ]]; then unpacked=$(du -sb "$SITE" | cut -f1)
  else unpacked=$(( $(du -sb "$SITE" | cut -f1) - $(stat -c%s "$SITE/$FA") )); fi
  {
    echo "BUNDLE=$bundle"
    echo "PARTS=$n"
    echo "TOTAL_BYTES=$total"
    echo "TAR_SHA256=$sha"
    echo "UNPACKED=$unpacked"
    echo "ENV=PYTHONPATH=/root/sglsite:/root/site HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 DO_NOT_TRACK=1"
    echo "VARIANT=$name"
    if [[ "$name" == triton ]]; then
      echo "SERVER_ARGS=--attention-backend triton"
    else
      echo "SERVER_ARGS="
    fi
    echo "REQUIRES=/root/site: the vLLM 0.26.0 bundle (TAR_SHA256 27928f004f1021dde8e72968c355ca7daa9752e60ad7e7044cb195dc0863968b)"
    echo "GLIBC_MAX=$GLIBC_MAX"
    echo "GLIBCXX_MAX=$GLIBCXX_MAX"
    echo "CXXABI_MAX=$CXXABI_MAX"
    (cd "$dir" && sha256sum part-* | awk '{print "SHA256 " $2 " " $1}')
  } > "$dir/MANIFEST"
  install_sh > "$dir/install.sh"; chmod +x "$dir/install.sh"
  echo "-- $name -> $dir"; ls -l "$dir"; cat "$dir/MANIFEST"
}

install_sh() { cat <<'INSTALL'
#!/usr/bin/env bash
# Run ON the device from the repo root:  bash .devstage-sglang/install.sh   (triton: .devstage-sglang/triton/install.sh)
# Made by scripts/sglang_bundle.sh. Stores the carried part-NN (checked against MANIFEST) under
# /root/devstage-sglang/<BUNDLE>/ (kept while the machine stays warm). Once every part is there it
# checks the whole stream, unpacks into /root/sglsite, imports SGLang's server modules once and
# prints `READY: export <env>`; otherwise `NOT READY` and what is missing. SGLang also needs the
# vLLM bundle in /root/site (bash .devstage/install.sh); without it: NOT READY. Idempotent.
set -uo pipefail

SRC="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT_STAGE="${DEVSTAGE_SGL_DIR:-/root/devstage-sglang}"
SITE="${DEVSTAGE_SGL_SITE:-/root/sglsite}"
BASE="${DEVSTAGE_SITE:-/root/site}"
mkdir -p "$ROOT_STAGE"

[[ -f "$SRC/MANIFEST" ]] || { echo "NO MANIFEST beside install.sh (carry .devstage-sglang/MANIFEST)"; echo "NOT READY"; exit 2; }
get() { sed -n "s/^$1=//p" "$SRC/MANIFEST" | head -1; }
BUNDLE="$(get BUNDLE)"; PARTS="$(get PARTS)"; TAR_SHA="$(get TAR_SHA256)"; ENVLINE="$(get ENV)"
ENVLINE="${ENVLINE//\/root\/sglsite/$SITE}"; ENVLINE="${ENVLINE//:\/root\/site/:$BASE}"
STAGE="$ROOT_STAGE/$BUNDLE"; mkdir -p "$STAGE"; cp -f "$SRC/MANIFEST" "$STAGE/MANIFEST"
want_sha() { awk -v f="$1" '$1=="SHA256" && $2==f {print $3}' "$SRC/MANIFEST"; }

sanity() {  # import check with the device's python3; writes $SITE/.devstage-sanity on success
  [[ -f "$BASE/vllm/__init__.py" || -d "$BASE/fastapi" ]] || {
    echo "the vLLM bundle is not unpacked in $BASE (it provides fastapi, pydantic, uvicorn, pyzmq, ...):"
    echo "stage it first: bash .devstage/install.sh with its parts (../shared/device/README.md)"; return 1; }
  local want_base; want_base="$(get REQUIRES | sed -n 's/.*TAR_SHA256 \([0-9a-f]*\).*/\1/p')"
  if [[ -n "$want_base" && -f "$BASE/.devstage-bundle" && "$(cat "$BASE/.devstage-bundle")" != "$want_base" ]]; then
    echo "  note: $BASE holds a different vLLM bundle than the one this was checked against"; fi
  local t=$(date +%s)
  env $ENVLINE VARIANT="$(get VARIANT)" python3 - <<'PY' || return 1
import importlib.metadata as md, os, sys, time
t = time.time()
for d in ["torch", "triton", "transformers", "tokenizers", "huggingface-hub", "numpy", "pydantic",
          "fastapi", "uvicorn", "openai", "xgrammar", "apache-tvm-ffi", "flashinfer-python",
          "sglang-kernel", "sglang"]:
    try: print(f"  effective {d}=={md.version(d)}")
    except Exception as e: print(f"  {d}: MISSING ({e})")
import torch
print(f"  cuda: {torch.cuda.is_available()} {torch.cuda.get_device_name(0) if torch.cuda.is_available() else ''}"
      f" cc={torch.cuda.get_device_capability(0) if torch.cuda.is_available() else None}")
import shutil
print(f"  nvcc for SGLang/flashinfer JIT kernels: {shutil.which('nvcc') or os.environ.get('CUDA_HOME') or 'NOT FOUND'};"
      f" ninja: {shutil.which('ninja') or 'NOT FOUND'}; c++: {shutil.which('c++') or 'NOT FOUND'}")
import sgl_kernel, flashinfer.sampling, xgrammar
if os.environ.get("VARIANT") == "fa3":
    from sgl_kernel import flash_ops  # noqa: F401  FA3 (the default attention backend on Hopper)
    print("  FA3 (sgl_kernel.flash_ops) loads")
import sglang, sglang.launch_server, sglang.srt.entrypoints.http_server
import sglang.srt.managers.scheduler, sglang.srt.model_executor.model_runner
import sglang.srt.layers.attention.triton_backend, sglang.srt.layers.attention.flashattention_backend
import sglang.bench_serving
print(f"  import OK: sglang {sglang.__version__}, sgl_kernel {sgl_kernel.__version__} ({time.time() - t:.0f} s)")
PY
  date +%s > "$SITE/.devstage-sanity"
}
ready_line() { echo "READY: export ${ENVLINE}"; }
finish() {
  if [[ -f "$SITE/.devstage-sanity" ]] || sanity; then
    [[ -n "$(get SERVER_ARGS)" ]] && echo "start the server with: $(get SERVER_ARGS)"
    ready_line; exit 0
  fi
  echo "NOT READY (unpacked in $SITE, but the import check failed: see above)"; exit 5
}

# Already unpacked from this very bundle?
if [[ -f "$SITE/.devstage-bundle" && "$(cat "$SITE/.devstage-bundle")" == "$TAR_SHA" ]]; then
  echo "already unpacked in $SITE ($BUNDLE, ${TAR_SHA:0:12})"; finish
fi

# Take in carried parts (checked before storing; the checked sha is kept beside each part).
shopt -s nullglob
for p in "$SRC"/part-*; do
  b="$(basename "$p")"; w="$(want_sha "$b")"
  [[ -n "$w" ]] || { echo "skip $b: not in MANIFEST"; continue; }
  if [[ -f "$STAGE/$b" && "$(cat "$STAGE/$b.sha256" 2>/dev/null)" == "$w" ]]; then echo "have $b"; continue; fi
  h="$(sha256sum "$p" | cut -d' ' -f1)"
  [[ "$h" == "$w" ]] || { echo "BAD $b (sha256 mismatch, not stored)"; continue; }
  cp -f "$p" "$STAGE/$b.tmp" && mv -f "$STAGE/$b.tmp" "$STAGE/$b" && echo "$w" > "$STAGE/$b.sha256" && echo "stored $b"
done

present=(); missing=()
for i in $(seq 0 $((PARTS-1))); do
  b="$(printf 'part-%02d' "$i")"
  if [[ -f "$STAGE/$b" && "$(cat "$STAGE/$b.sha256" 2>/dev/null)" == "$(want_sha "$b")" ]]; then present+=("$b"); else missing+=("$b"); fi
done
echo "parts present (${#present[@]}/$PARTS): ${present[*]:-none}"
if (( ${#missing[@]} )); then echo "parts missing: ${missing[*]}"; echo "NOT READY"; exit 1; fi

echo "all parts present; checking and unpacking into $SITE ..."
files=(); for i in $(seq 0 $((PARTS-1))); do files+=("$STAGE/$(printf 'part-%02d' "$i")"); done
got="$(cat "${files[@]}" | sha256sum | cut -d' ' -f1)"
if [[ "$got" != "$TAR_SHA" ]]; then echo "BUNDLE SHA MISMATCH ($got != $TAR_SHA); rm -rf $STAGE and resend"; echo "NOT READY"; exit 3; fi
TMP="$SITE.tmp.$$"; rm -rf "$TMP"; mkdir -p "$TMP"
t0=$(date +%s)
# The stream may be two xz streams back to back (fa3 = base + flash_ops): xz -d reads on through
# both, tar -i reads past the first archive's end.
if command -v xz >/dev/null 2>&1; then
  cat "${files[@]}" | xz -dc -T0 | tar -x -i -C "$TMP" || { echo "unpack failed"; rm -rf "$TMP"; echo "NOT READY"; exit 4; }
else
  cat "${files[@]}" | python3 -c 'import sys, lzma, tarfile
with lzma.open(sys.stdin.buffer) as f, tarfile.open(fileobj=f, mode="r|", ignore_zeros=True) as t:
    t.extractall(sys.argv[1], **({"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}))' "$TMP" \
    || { echo "unpack failed"; rm -rf "$TMP"; echo "NOT READY"; exit 4; }
fi
echo "$TAR_SHA" > "$TMP/.devstage-bundle"
rm -rf "$SITE.old"; [[ -d "$SITE" ]] && mv "$SITE" "$SITE.old"; mv "$TMP" "$SITE"; rm -rf "$SITE.old"
echo "unpacked $(du -sh "$SITE" | cut -f1) in $(( $(date +%s) - t0 )) s"
finish
INSTALL
}

for v in $VARIANTS; do
  case "$v" in
    fa3)    write_variant fa3 "$OUT" "$WORKDIR/base.tar.xz" "$WORKDIR/fa3.tar.xz" ;;
    triton) write_variant triton "$OUT/triton" "$WORKDIR/base.tar.xz" ;;
    *) echo "unknown variant $v" >&2; exit 1 ;;
  esac
done
echo "== done in $(( $(date +%s) - t0 )) s"
