"""Params validation: every problem is caught before an engine starts, naming file and key."""

from pathlib import Path

import pytest

from tunebook.inputs import params as P

PARAMS = Path(__file__).resolve().parents[2] / "params"


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    return p


def _err(tmp_path: Path, text: str) -> P.ParamsError:
    with pytest.raises(P.ParamsError) as ei:
        P.load(_write(tmp_path, text))
    return ei.value


@pytest.mark.parametrize("path", sorted(PARAMS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_params_are_valid(path: Path) -> None:
    p = P.load(path)
    assert p.experiment and p.model and p.load.users


def test_quickstart_shape() -> None:
    p = P.load(PARAMS / "quickstart.yaml")
    assert p.model == "qwen3-tiny"
    assert p.engine_grid == ({}, {"max_num_seqs": 4})
    assert p.load.users == (1, 2, 4, 8)


def test_unknown_key_suggests(tmp_path: Path) -> None:
    e = _err(tmp_path, "experiment: x\nmodel: qwen3-tiny\nengine: {max_num_seq: 4}\n")
    assert "engine.max_num_seq" in str(e) and "max_num_seqs" in str(e)
    assert str(tmp_path / "p.yaml") in str(e)


def test_yaml_syntax_error_names_line(tmp_path: Path) -> None:
    e = _err(tmp_path, "experiment: x\nmodel: [qwen3\n")
    assert "YAML syntax error" in str(e) and "line" in str(e)


@pytest.mark.parametrize("text,key", [
    ("experiment: x\nmodel: m\nload: {users: [1, -2]}\n", "load.users[1]"),
    ("experiment: x\nmodel: m\nload: {users: []}\n", "load.users"),
    ("experiment: x\nmodel: m\nload: {users: [1, true]}\n", "load.users[1]"),
    ("experiment: ../etc\nmodel: m\n", "experiment"),
    ("experiment: x\nmodel: m\nengine: {gpu_memory_utilization: 1.5}\n",
     "engine.gpu_memory_utilization"),
    ("experiment: x\nmodel: m\nengine: {enforce_eager: 'yes'}\n", "engine.enforce_eager"),
    ("experiment: x\nmodel: m\nengine_grid: []\n", "engine_grid"),
    ("experiment: x\nmodel: m\nengine_env: {HF_TOKEN: abc}\n", "engine_env.HF_TOKEN"),
    ("experiment: x\nmodel: m\nengine_env: {VLLM_API_KEY: abc}\n", "engine_env.VLLM_API_KEY"),
    ("experiment: x\nmodel: m\nload: {dataset: random_prefix}\n", "load.prefix_len"),
    ("experiment: x\nmodel: m\nengine: {max_model_len: 100}\nload: {input_len: 100}\n",
     "load.input_len"),
    ("experiment: x\nmodel: m\nengine: {gpu_memory_utilization: 0.5, "
     "kv_cache_memory_bytes: 100}\n", "engine.kv_cache_memory_bytes"),
    ("experiment: x\nmodel: m\nengine: {speculative_config: {method: ngram}}\n",
     "engine.speculative_config.num_speculative_tokens"),
    ("experiment: x\nmodel: m\nload: {users: " + str(list(range(1, 1001))) + "}\n",
     "load.users"),
    ("experiment: x\n", "model"),
])
def test_bad_field_names_key(tmp_path: Path, text: str, key: str) -> None:
    e = _err(tmp_path, text)
    assert any(k == key for k, _ in e.problems), e.problems
    assert f"{key}:" in str(e)


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    e = _err(tmp_path, "experiment: x\nmodel: m\nrepeats: 0\nload: {users: [0], output_len: -1}\n")
    keys = {k for k, _ in e.problems}
    assert {"repeats", "load.users[0]", "load.output_len"} <= keys


def test_overrides_and_round_trip(tmp_path: Path) -> None:
    p = P.load(PARAMS / "quickstart.yaml", {"load.users": [1, 2], "engine.max_num_seqs": 8})
    assert p.load.users == (1, 2) and p.engine["max_num_seqs"] == 8
    again = P.parse(p.to_dict(), source="round-trip")
    assert again.to_dict() == p.to_dict()


def test_cartesian_engine_grid(tmp_path: Path) -> None:
    p = P.load(_write(tmp_path, "experiment: x\nmodel: m\nengine_grid:\n"
                                "  max_num_seqs: [4, 8]\n  enforce_eager: [true, false]\n"))
    assert len(p.engine_grid) == 4
    assert {"max_num_seqs": 8, "enforce_eager": False} in p.engine_grid


def test_parse_override_is_yaml() -> None:
    assert P.parse_override("[1,2]") == [1, 2]
    assert P.parse_override("true") is True
    assert P.parse_override("qwen3-8b") == "qwen3-8b"
    with pytest.raises(P.ParamsError, match=r"-p: load.users: '\[1,': YAML syntax error"):
        P.parse_override("[1,", "load.users")


# -- figures, prompts and context length: caught before any engine starts ---------------------


def test_figures_must_be_the_manuals(tmp_path: Path) -> None:
    from tunebook.core.manual import FIGURES

    e = _err(tmp_path, "experiment: x\nmodel: qwen3-tiny\nfigures: ['1.1', '9.9', 3.1]\n")
    assert [k for k, _ in e.problems] == ["figures[1]"]
    assert "unknown figure '9.9'" in str(e) and ", ".join(FIGURES) in str(e)
    p = P.load(_write(tmp_path, "experiment: x\nmodel: qwen3-tiny\nfigures: ['1.1', 3.1]\n"))
    assert p.figures == ("1.1", "3.1")


@pytest.mark.parametrize("path", sorted(PARAMS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_params_fit_the_default_caps(path: Path) -> None:
    """max_prompts is sized so every shipped sweep passes with room to spare."""
    p = P.load(path)
    sent = p.load.prompts_sent() * len(p.engine_grid) * p.repeats
    assert p.max_prompts == P.DEFAULT_MAX_PROMPTS and sent * 10 <= p.max_prompts


def test_the_prompts_cap_names_what_blew_it_up_and_can_be_raised(tmp_path: Path) -> None:
    base = "experiment: x\nmodel: qwen3-tiny\nengine: {max_model_len: 1024}\n"
    cases = {
        "load: {users: [100000000]}\n": "load.users",
        "load: {users: [1, 2], prompts_per_user: 100000}\n": "load.prompts_per_user",
        "load: {users: [1], num_prompts: 200000}\n": "load.num_prompts",
        "load: {users: [1], num_warmups: 200000}\n": "load.num_warmups",
        "load: {users: [1], num_prompts: 200}\nrepeats: 500\n": "repeats",
    }
    for text, key in cases.items():
        e = _err(tmp_path, base + text)
        assert [k for k, _ in e.problems] == [key], (text, e.problems)
        assert "max_prompts=100,000" in str(e) and "raise max_prompts deliberately" in str(e)
    p = P.load(_write(tmp_path, base + "load: {users: [1], num_prompts: 200000}\n"
                                       "max_prompts: 300000\n"))
    assert p.max_prompts == 300_000 and P.parse(p.to_dict()).max_prompts == 300_000


def test_requests_must_fit_the_models_context(tmp_path: Path) -> None:
    # a preset's config: qwen3-tiny has max_position_embeddings 4096
    e = _err(tmp_path, "experiment: x\nmodel: qwen3-tiny\nload: {input_len: 4000, "
                       "output_len: 100}\n")
    assert [k for k, _ in e.problems] == ["load.input_len"]
    assert "4,100 exceeds the context length of qwen3-tiny (4,096 tokens" in str(e)
    P.load(_write(tmp_path, "experiment: x\nmodel: qwen3-tiny\nload: {input_len: 3000}\n"))
    # max_model_len set: that is the limit (checked as before), not the model's
    P.load(_write(tmp_path, "experiment: x\nmodel: qwen3-tiny\nengine: {max_model_len: 8192}\n"
                            "load: {input_len: 5000}\n"))
    # a local folder's config.json
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text('{"max_position_embeddings": 2048, "n_positions": 1024}')
    e = _err(tmp_path, f"experiment: x\nmodel: {folder}\nload: {{input_len: 1000, "
                       "output_len: 100}\n")
    assert "1,100 exceeds the context length" in str(e) and "(1,024 tokens" in str(e)
    # rope scaling stretches the context: not checked offline, nor is a hub id
    (folder / "config.json").write_text('{"max_position_embeddings": 1024, '
                                        '"rope_scaling": {"rope_type": "yarn", "factor": 4}}')
    P.load(_write(tmp_path, f"experiment: x\nmodel: {folder}\nload: {{input_len: 3000}}\n"))
    P.load(_write(tmp_path, "experiment: x\nmodel: Qwen/Qwen3-8B\nload: {input_len: 900000}\n"))
