"""The bad-params corpus (tests/bad_params/): each file is one mistake a user could make.

Every file must fail with exit code 2 and a single error whose lines each start with the
file's path and name the wrong key, before anything is written or any engine starts.

Each file's first line says what is expected, machine-readably::

    # expect: load.users[1] | positive integer     (a key, then words the message must hold)
    # expect: <file> | YAML syntax error           (the file as a whole is wrong)

Files whose first line cannot hold that comment (empty, not UTF-8 from the first byte) are
listed in SIDE_TABLE instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tunebook.cli import EXIT_BAD_PARAMS, main
from tunebook.inputs import params as P
from tunebook.measure import sweep
from tunebook.present import report
from tunebook.servers import vllm as engine

CORPUS = Path(__file__).resolve().parents[1] / "bad_params"
FILES = sorted(p for p in CORPUS.iterdir() if p.is_file())
SIDE_TABLE: dict[str, tuple[str, str]] = {
    "empty-file.yaml": ("<file>", "empty"),
    "utf16-file.yaml": ("<file>", "UTF-8"),
}
# One mistake, one problem line; these files are wrong in several ways at once by nature.
SEVERAL_PROBLEMS = {"notebook-json-not-params.yaml"}
EXPECT = re.compile(r"^# expect: (?P<key>\S+)(?: \| (?P<words>.+))?$")
COMMANDS = {
    "run-dry-run": ["run", "{file}", "--dry-run"],
    "plan": ["plan", "{file}"],
    "run": ["run", "{file}", "-q"],  # no dry run: must still stop before papermill/engines
}


def expectation(path: Path) -> tuple[str, str | None]:
    """(dotted key or '<file>', words the message must contain or None)."""
    if path.name in SIDE_TABLE:
        return SIDE_TABLE[path.name]
    first = path.read_bytes().split(b"\n", 1)[0].decode("utf-8", "replace").rstrip("\r")
    m = EXPECT.match(first)
    assert m, f"{path.name}: first line must be '# expect: KEY [| words]', got {first!r}"
    return m["key"], m["words"]


def test_corpus_is_large_enough() -> None:
    assert len(FILES) >= 30, [p.name for p in FILES]


def test_every_file_states_its_expectation() -> None:
    assert set(SIDE_TABLE) <= {p.name for p in FILES}, "SIDE_TABLE names a missing file"
    for path in FILES:
        key, words = expectation(path)
        if key == "<file>":
            assert words, f"{path.name}: a <file> expectation needs the words that say why"
        if path.name in SIDE_TABLE:  # the comment could not be there; make sure it is not
            assert not path.read_bytes().startswith(b"# expect:"), path.name


@pytest.fixture
def nothing_starts(monkeypatch: pytest.MonkeyPatch) -> None:
    def engine_start(*args: object, **kwargs: object) -> None:
        pytest.fail("an engine was started for bad params")

    def papermill(*args: object, **kwargs: object) -> None:
        pytest.fail("papermill was started for bad params")

    def sweep_run(*args: object, **kwargs: object) -> None:
        pytest.fail("a sweep was run for bad params")

    monkeypatch.setattr(engine.Engine, "start", engine_start)
    monkeypatch.setattr(report, "execute", papermill)
    monkeypatch.setattr(sweep.Sweep, "run", sweep_run)


@pytest.mark.usefixtures("nothing_starts")
@pytest.mark.parametrize("command", list(COMMANDS))
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_bad_params_fail_cleanly(path: Path, command: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    key, words = expectation(path)
    outputs = tmp_path / "outputs"
    argv = [a.format(file=path) for a in COMMANDS[command]] + ["--outputs", str(outputs)]

    rc = main(argv)
    out, err = capsys.readouterr()

    assert rc == EXIT_BAD_PARAMS, f"exit {rc}\nstdout: {out}\nstderr: {err}"
    assert "Traceback" not in err and "Error:" not in err, err
    assert out == "", f"nothing is printed to stdout on bad params: {out!r}"
    # One error: a `tunebook:` line, then one indented line per problem, each naming the file.
    lines = err.rstrip("\n").splitlines()
    assert len(lines) >= 2 and lines[0].startswith("tunebook: "), err
    assert err.count("tunebook:") == 1, err
    assert all(line.startswith("  ") for line in lines[1:]), err
    problems = [line.strip() for line in lines[1:]]
    assert all(p.startswith(f"{path}: ") for p in problems), err
    assert len(problems) == 1 or path.name in SEVERAL_PROBLEMS, err
    if key == "<file>":
        named = problems
    else:
        named = [p for p in problems if p.startswith(f"{path}: {key}: ")]
        assert named, f"no line '{path}: {key}: ...' in\n{err}"
    if words:
        assert any(words in p for p in named), f"{words!r} not in\n{err}"
    # Nothing written, nothing started (the fixture fails the test on any start).
    assert not outputs.exists() or not any(outputs.rglob("*")), list(outputs.rglob("*"))


# ------------------------------------------------------------------------------------------
# The loader's guards must not reject ordinary YAML.


def test_anchors_and_merge_keys_still_load(tmp_path: Path) -> None:
    p = tmp_path / "anchors.yaml"
    p.write_text(
        "experiment: anchors\nmodel: qwen3-tiny\n"
        "engine: &base {max_model_len: 1024, max_num_seqs: 8}\n"
        "engine_grid:\n"
        "  - {<<: *base, max_num_seqs: 4}\n"  # merge, then override: not a duplicate key
        "  - {<<: *base, enforce_eager: true}\n"
        "load: {users: &u [1, 2], input_len: 64}\n"
    )
    params = P.load(p)
    assert params.engine_grid[0]["max_num_seqs"] == 4
    assert params.engine_grid[1]["enforce_eager"] is True
    assert params.load.users == (1, 2)


def test_duplicate_key_inside_a_list_names_the_index(tmp_path: Path) -> None:
    p = tmp_path / "dup.yaml"
    p.write_text("experiment: x\nmodel: qwen3-tiny\nengine_grid:\n  - {}\n"
                 "  - {max_num_seqs: 4, max_num_seqs: 8}\n")
    with pytest.raises(P.ParamsError) as ei:
        P.load(p)
    assert [k for k, _ in ei.value.problems] == ["engine_grid[1].max_num_seqs"]


def test_alias_bomb_fails_fast(tmp_path: Path) -> None:
    import time

    t0 = time.monotonic()
    with pytest.raises(P.ParamsError, match="alias"):
        P.load(CORPUS / "yaml-alias-bomb.yaml")
    assert time.monotonic() - t0 < 2


def test_many_problems_are_capped(tmp_path: Path) -> None:
    p = tmp_path / "many.yaml"
    p.write_text("experiment: x\nmodel: qwen3-tiny\nload: {users: [" + ", ".join(["0"] * 50)
                 + "]}\n")
    with pytest.raises(P.ParamsError) as ei:
        P.load(p)
    text = str(ei.value)
    assert len(text.splitlines()) == 1 + P.MAX_PROBLEMS + 1 and "more problems" in text
