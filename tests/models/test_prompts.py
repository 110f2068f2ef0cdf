"""Fig 4.2's prompt sets: built offline from the standard library, read by vLLM's own client."""

from __future__ import annotations

import ast
import hashlib
import json
import platform
import random
import statistics
import tokenize
from io import StringIO
from pathlib import Path
from typing import Any

import pytest

from tunebook.core import config
from tunebook.inputs import params as P
from tunebook.inputs.load import DATASETS, LoadPoint, bench_argv
from tunebook.models import prompts
from tunebook.models.presets import build_model_dir

SMALL = {"max_prompt_tokens": 512, "min_answer_tokens": 64}  # a CPU-sized load point


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_model_dir("qwen3-tiny", tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir: Path) -> Any:
    return prompts._load_tokenizer(str(tokenizer_dir))


@pytest.fixture(scope="module")
def all_records(tokenizer: Any) -> dict[str, list[dict[str, Any]]]:
    return {name: prompts.build_records(name, tokenizer, **SMALL) for name in prompts.PROMPT_SETS}


def _read(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_snippets_come_from_this_pythons_stdlib() -> None:
    snippets = prompts.stdlib_snippets()
    assert len(snippets) >= 100
    assert len({(s.module, s.function) for s in snippets}) == len(snippets)
    for s in snippets:
        assert ast.parse(s.code).body[0].name == s.function.split(".")[-1]
    for s in random.Random(0).sample(snippets, 20):
        assert prompts.MIN_LINES <= s.lines <= prompts.MAX_LINES
        source = (prompts.stdlib_dir() / s.source_file).read_text()
        # the dedented code is the function's text in its file, line for line
        assert all(line.strip() in source for line in s.code.splitlines())
        assert s.code.startswith("def ") and s.code.isascii()
        assert s.sha256 == hashlib.sha256(s.code.encode()).hexdigest()


def test_only_pinned_functions_are_offered() -> None:
    """The CPU machine and the H200 (different Pythons) offer the same functions."""
    pinned = prompts.pinned_functions()
    offered = prompts.stdlib_snippets()
    assert {(s.module, s.function, s.sha256) for s in offered} <= pinned
    every = prompts.stdlib_snippets(pinned=False)
    assert set(offered) <= set(every) and len(every) > len(offered)
    data = json.loads(config.package_data(prompts.PINNED_FILE).read_text())
    assert len(data["pythons"]) >= 2 and len(data["functions"]) == len(pinned)


def test_snippet_order_is_fixed_by_names() -> None:
    snippets = prompts.stdlib_snippets()
    keys = [hashlib.sha256(f"{s.module}:{s.function}".encode()).hexdigest() for s in snippets]
    assert keys == sorted(keys)


def test_rename_changes_names_only() -> None:
    for s in prompts.stdlib_snippets()[:50]:
        renamed = s.renamed()
        names = [t.string for t in tokenize.generate_tokens(StringIO(renamed).readline)
                 if t.type == tokenize.NAME]
        assert s.old not in names and s.new in names
        assert ast.dump(ast.parse(renamed)).count(f"'{s.new}'") >= 2  # a parameter, used
        assert renamed.replace(s.new, s.old) == s.code  # nothing else changed


def test_every_set_has_the_same_functions(all_records: dict[str, list[dict]]) -> None:
    ids = {name: [(r["module"], r["function"], r["source_sha256"]) for r in recs]
           for name, recs in all_records.items()}
    first = ids["code_edit"]
    assert len(first) >= prompts.MIN_RECORDS
    assert all(v == first for v in ids.values())
    assert {r["kind"] for recs in all_records.values() for r in recs} == set(prompts.KINDS)


def test_prompt_lengths_compare_across_sets(all_records: dict[str, list[dict]]) -> None:
    base = [r["prompt_tokens"] for r in all_records["code_edit"]]
    for name, recs in all_records.items():
        ratio = statistics.median(r["prompt_tokens"] / b for r, b in zip(recs, base, strict=True))
        assert 0.85 <= ratio <= 1.15, (name, ratio)
        assert max(r["prompt_tokens"] for r in recs) <= SMALL["max_prompt_tokens"]
        assert min(r["code_tokens"] for r in recs) >= SMALL["min_answer_tokens"]


def test_records_carry_provenance(all_records: dict[str, list[dict]]) -> None:
    by_sha = {s.sha256: s for s in prompts.stdlib_snippets()}
    for name, recs in all_records.items():
        for r in recs:
            assert r["set"] == name and r["python"] == platform.python_version()
            assert r["generator"] == prompts.GENERATOR
            snip = by_sha[r["source_sha256"]]
            assert (r["module"], r["function"], r["lines"]) == (snip.module, snip.function,
                                                                 snip.lines)
            assert r["source_file"].endswith(".py") and snip.code in r["prompt"]
            if r["kind"] == "fresh_text":
                assert r["reference"] is None
            elif name == "code_edit_rename":
                assert r["reference"] == snip.renamed() and f"`{snip.old}`" in r["prompt"]
            else:
                assert r["reference"] == snip.code


def test_file_is_deterministic(tmp_path: Path, tokenizer_dir: Path, tokenizer: Any) -> None:
    a = prompts.dataset_file("code_edit", tokenizer, **SMALL, root=tmp_path / "a")
    b = prompts.dataset_file("code_edit", str(tokenizer_dir), **SMALL, root=tmp_path / "b")
    assert a.name == b.name and a.read_bytes() == b.read_bytes()
    assert a.parent == tmp_path / "a" / "prompts"
    assert a.name.startswith(f"code_edit-py{''.join(platform.python_version_tuple()[:2])}-")
    mtime = a.stat().st_mtime_ns
    assert prompts.dataset_file("code_edit", tokenizer, **SMALL, root=tmp_path / "a") == a
    assert a.stat().st_mtime_ns == mtime  # reused, never rewritten
    other = prompts.dataset_file("fresh_text", tokenizer, **SMALL, root=tmp_path / "a")
    assert other != a and {r["kind"] for r in _read(other)} == {"fresh_text"}


def test_too_few_functions_is_a_clear_error(tokenizer: Any) -> None:
    with pytest.raises(prompts.PromptsError, match="raise input_len or lower output_len"):
        prompts.build_records("code_edit", tokenizer, max_prompt_tokens=300,
                              min_answer_tokens=400)
    with pytest.raises(prompts.PromptsError, match="unknown prompt set 'code_edits'"):
        prompts.build_records("code_edits", tokenizer, **SMALL)


def test_vllms_custom_dataset_reads_the_file(tmp_path: Path, tokenizer: Any) -> None:
    """vLLM's own CustomDataset (what `--dataset-name custom` builds) reads the file, applies
    the chat template and counts each prompt's tokens as the record says."""
    from vllm.benchmarks.datasets import CustomDataset

    path = prompts.dataset_file("code_edit", tokenizer, **SMALL, root=tmp_path)
    records = _read(path)
    expected = {tokenizer.apply_chat_template([{"role": "user", "content": r["prompt"]}],
                                              add_generation_prompt=True, tokenize=False):
                r["prompt_tokens"] for r in records}
    ds = CustomDataset(dataset_path=str(path), random_seed=3)
    sampled = ds.sample(tokenizer=tokenizer, num_requests=6, output_len=48)
    assert len(sampled) == 6
    for req in sampled:
        assert req.prompt_len == expected[req.prompt]  # a record's prompt, chat-templated
        assert req.expected_output_len == 48
    again = CustomDataset(dataset_path=str(path), random_seed=3).sample(
        tokenizer=tokenizer, num_requests=6, output_len=48)
    assert [r.prompt for r in again] == [r.prompt for r in sampled]  # the seed fixes the draw


def _point(dataset: str, **kw: Any) -> LoadPoint:
    base = dict(dataset=dataset, max_concurrency=4, request_rate=None, input_len=512,
                output_len=64, prefix_len=0, num_prefixes=1, num_prompts=16, num_warmups=1,
                seed=5)
    return LoadPoint(**{**base, **kw})


@pytest.mark.parametrize("dataset", list(prompts.PROMPT_SETS))
def test_bench_argv_points_vllms_client_at_the_file(dataset: str, tokenizer_dir: Path,
                                                    tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.benchmarks import serve as vbs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    monkeypatch.setenv("TUNEBOOK_CACHE", str(tmp_path))
    argv = bench_argv(_point(dataset), "http://h:1", "m", str(tokenizer_dir), 11)
    parser = FlexibleArgumentParser()
    vbs.add_cli_args(parser)
    args = parser.parse_args(argv)  # what run_bench does
    assert args.dataset_name == "custom" and args.custom_output_len == 64
    assert args.num_prompts == 16 and args.seed == 11 and args.max_concurrency == 4
    assert not args.skip_chat_template  # the client applies the model's chat template
    path = Path(args.dataset_path)
    assert path.parent == tmp_path / "prompts" and path.suffix == ".jsonl"
    recs = _read(path)
    assert {r["set"] for r in recs} == {dataset}
    assert max(r["prompt_tokens"] for r in recs) <= 512
    assert min(r["code_tokens"] for r in recs) >= 64
    assert "--random-input-len" not in argv


def _params(**load: Any) -> dict[str, Any]:
    return {"experiment": "x", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
            "load": load}


def test_params_accept_the_prompt_sets() -> None:
    assert set(prompts.PROMPT_SETS) <= set(DATASETS)
    for name in prompts.PROMPT_SETS:
        p = P.parse(_params(dataset=name, input_len=512, output_len=64, users=[1, 4]))
        assert p.load.dataset == name and p.load.input_len == 512


@pytest.mark.parametrize(("load", "key", "words"), [
    ({"dataset": "code_edits", "input_len": 512}, "load.dataset", "'code_edit'"),
    ({"dataset": "code_edit"}, "load.input_len", ">= 256 tokens, got 128"),
    ({"dataset": "fresh_text", "input_len": 100}, "load.input_len", "caps each prompt"),
    ({"dataset": "code_edit", "input_len": 512, "prefix_len": 64}, "load.prefix_len",
     "no shared prefix"),
    ({"dataset": "code_edit", "input_len": 900, "output_len": 256}, "load.input_len",
     "exceeds max_model_len 1024"),
])
def test_params_reject_bad_prompt_loads(load: dict[str, Any], key: str, words: str) -> None:
    with pytest.raises(P.ParamsError) as ei:
        P.parse(_params(**load))
    problems = dict(ei.value.problems)
    assert key in problems and words in problems[key], problems


def test_a_bad_input_len_is_reported_once() -> None:
    with pytest.raises(P.ParamsError) as ei:
        P.parse(_params(dataset="code_edit", input_len="long"))
    assert [k for k, _ in ei.value.problems] == ["load.input_len"]


# --- replaying vLLM's n-gram proposer -------------------------------------------------------

def test_ngram_propose_matches_vllms_proposer() -> None:
    np = pytest.importorskip("numpy")
    from vllm.v1.spec_decode.ngram_proposer import (
        _find_longest_matched_ngram_and_propose_tokens as vllm_propose,
    )

    rng = random.Random(0)
    for _ in range(3000):
        ctx = [rng.randrange(rng.randint(2, 4)) for _ in range(rng.randint(1, 40))]
        lo = rng.randint(1, 4)
        hi, k = rng.randint(lo, 6), rng.randint(1, 5)
        want = vllm_propose(np.array(ctx, dtype=np.int32), lo, hi, 10**6, k).tolist()
        assert prompts.ngram_propose(ctx, k, lo, hi) == want, (ctx, lo, hi, k)


def test_ngram_replay_counts_a_copy_and_a_fresh_answer() -> None:
    prompt = list(range(100, 140))
    copy = prompt[5:35]  # the answer repeats 30 prompt tokens
    r = prompts.ngram_replay(prompt, copy, k=4, min_n=3, max_n=3)
    # 105 comes from the prefill; 106 and 107 find no earlier 3-gram ending in them (139, 105
    # never occur together in the prompt); from 107 on every draft of 4 is right, until the
    # last one, which runs past the answer's 30 tokens
    assert r["drafts"] == 6 and r["draft_tokens"] == 24
    assert r["accepted_tokens"] == 22 and r["accepted_per_position"] == [6, 6, 5, 5]
    assert r["target_passes"] == 8 and r["tokens_per_pass"] == 29 / 8
    assert r["acceptance"] == 22 / 24
    fresh = prompts.ngram_replay(prompt, list(range(1, 31)), k=4, min_n=3, max_n=3)
    assert fresh["drafts"] == fresh["draft_tokens"] == 0 and fresh["acceptance"] is None
    assert fresh["tokens_per_pass"] == 1.0 and fresh["target_passes"] == 29
