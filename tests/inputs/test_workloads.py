"""Workload files (tunebook.inputs.workloads): the four formats read, checked, cut and scaled,
then sent through vLLM's own client code (its dataset classes, no server); malformed files
refused by params before any engine starts, naming the file, the key and the line."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tunebook.inputs import params as P
from tunebook.inputs.load import bench_argv
from tunebook.inputs.plan import make_plan
from tunebook.inputs.workloads import formats as F
from tunebook.inputs.workloads import replay as R
from tunebook.measure import client
from tunebook.models.presets import resolve_model

REPO = Path(__file__).resolve().parents[2]
AZURE = REPO / "params" / "traces" / "azure-conv-2023-first180s.csv"
MOONCAKE = REPO / "params" / "traces" / "mooncake-conversation-first180s.jsonl"
SHARED = REPO.parent / "shared" / "data" / "traces"  # the full traces, where a checkout has them


def _params(file: Path, **load) -> P.SweepParams:
    return P.parse({"experiment": "w", "model": "qwen3-tiny", "engine": {"max_model_len": 1024},
                    "load": {"dataset": "file", "file": str(file), **load}})


def _write(tmp: Path, name: str, text: str) -> Path:
    p = tmp / name
    p.write_text(text)
    return p


def _small_files(tmp: Path) -> dict[str, tuple[Path, dict]]:
    """format -> (a small file of it, the load keys that send it)."""
    conv = [{"conversations": [{"from": "human", "value": f"Say {w} twice."},
                               {"from": "gpt", "value": f"{w} {w}, said twice over."}]}
            for w in ("yes", "no", "maybe", "never")]
    return {
        "sharegpt": (_write(tmp, "chat.json", json.dumps(conv)), {"users": [2]}),
        "custom": (_write(tmp, "prompts.jsonl", "".join(
            json.dumps({"prompt": f"Count to {n}.", "output_tokens": n}) + "\n"
            for n in (3, 5, 7))), {"users": [1], "num_prompts": 3}),
        "timed_trace": (_write(tmp, "trace.jsonl", "".join(json.dumps(
            {"timestamp": t, "input_length": n, "output_length": 4, "hash_ids": ids}) + "\n"
            for t, n, ids in ((0, 40, [0, 1, 2]), (250, 30, [0, 1]), (900, 20, [7, 8])))),
            {"block_tokens": 16, "speeds": [1, 2]}),
        "csv": (_write(tmp, "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                          "2023-11-16 18:15:46.6805900,37,4\n"
                                          "2023-11-16 18:15:47.1000000,12,6\n"),
                {"speeds": [1]}),
    }


def test_each_format_is_sent_by_vllms_client(tmp_path: Path) -> None:
    """Each format, on a file written here and on the real trace samples: the requests vLLM's
    client makes of the prepared file are the prepared requests (count, and for a trace each
    prompt's token count, answer length and arrival time at the replay speed)."""
    tokenizer = str(resolve_model("qwen3-tiny").tokenizer)
    cases = {name: (path, load) for name, (path, load) in _small_files(tmp_path).items()}
    cases["azure sample"] = (AZURE, {"first": 40, "length_scale": 0.125, "speeds": [2]})
    cases["mooncake sample"] = (MOONCAKE, {"window_s": [0, 20], "length_scale": 1 / 32,
                                           "max_input_len": 768, "max_output_len": 64})
    for name, (path, load) in cases.items():
        plan = make_plan(_params(path, **load))
        point = plan.runs[-1].point
        w = point.workload
        assert w is not None and w.source == path.name, name
        sent = client.sample_requests(bench_argv(point, "http://127.0.0.1:9", "m", tokenizer, 1))
        records = R.prepare(w.replay).records
        if w.timed:
            assert len(sent) == w.requests == len(records), name
            speed = point.replay_speed
            for s, rec in zip(sent, records, strict=True):
                assert (s.prompt_len, s.expected_output_len) == (
                    rec["input_length"], rec["output_length"]), name
                assert s.timestamp == pytest.approx(rec["timestamp"] / speed), name
        else:
            assert len(sent) == point.num_prompts, name
            assert {s.prompt for s in sent} <= {json.dumps(r) for r in records} or all(
                isinstance(s.prompt, str) for s in sent), name
    assert "timed_trace" in make_plan(_params(AZURE, first=5)).runs[0].point.workload.conversion


def test_a_trace_sweeps_its_speeds_and_its_run_ids_follow_what_is_sent(tmp_path: Path) -> None:
    """A trace's load axis is its replay speed; the run id changes with what is sent (window,
    scaling, caps, speed) and not with the file's name or the goodput bounds."""
    p = _params(MOONCAKE, window_s=[0, 30], speeds=[0.5, 1, 4], length_scale=0.0625,
                max_input_len=512, goodput={"ttft_ms": 2000, "tpot_ms": 100})
    runs = make_plan(p).runs
    assert [r.point.replay_speed for r in runs] == [0.5, 1, 4]
    assert [r.run_id.split("-")[-2] for r in runs] == ["x0.5", "x1", "x4"]
    row = runs[0].point.as_row()
    assert row["max_concurrency"] is None and row["workload_file"] == MOONCAKE.name
    assert row["goodput_slo"] == "ttft:2000 tpot:100" and row["workload_capped_inputs"] >= 0
    assert "/" not in json.dumps({k: v for k, v in row.items() if k.startswith("workload")})
    ids = {r.run_id for r in runs}
    same = make_plan(_params(MOONCAKE, window_s=[0, 30], speeds=[0.5, 1, 4],
                             length_scale=0.0625, max_input_len=512)).runs
    assert {r.run_id for r in same} == ids  # goodput judges a run, it does not change it
    copy = tmp_path / "renamed.jsonl"
    copy.write_bytes(MOONCAKE.read_bytes())
    renamed = make_plan(_params(copy, window_s=[0, 30], speeds=[0.5, 1, 4],
                                length_scale=0.0625, max_input_len=512)).runs
    assert {r.run_id for r in renamed} == ids
    for change in ({"window_s": [0, 31]}, {"length_scale": 0.125}, {"max_input_len": 256}):
        other = make_plan(_params(MOONCAKE, **{"window_s": [0, 30], "speeds": [0.5, 1, 4],
                                               "length_scale": 0.0625, "max_input_len": 512,
                                               **change})).runs
        assert not {r.run_id for r in other} & ids, change
    assert P.parse(p.to_dict()).to_dict() == p.to_dict()  # params round-trip, path as written


def test_scaling_keeps_what_requests_share() -> None:
    """Mooncake's hash ids mark shared 512-token blocks: scaled by 1/16 the blocks are 32
    tokens and the requests that shared k blocks still share k; a cap keeps the first blocks."""
    full = R.prepare(R.Replay(MOONCAKE, window_s=(0, 30)))
    small = R.prepare(R.Replay(MOONCAKE, window_s=(0, 30), length_scale=1 / 16,
                               max_input_len=256))
    assert (full.block_tokens, small.block_tokens) == (512, 32)
    for a, b in zip(full.records, small.records, strict=True):
        n = len(b["hash_ids"])
        assert b["hash_ids"] == a["hash_ids"][:n] and n * 32 >= b["input_length"]
        assert b["input_length"] == min(256, round(a["input_length"] / 16))
    firsts = [r["hash_ids"][0] for r in small.records]
    assert len(set(firsts)) < len(firsts)  # shared prefixes: the trace's own
    assert small.capped_inputs == sum(round(a["input_length"] / 16) > 256
                                      for a in full.records)


BAD = {
    "missing": (None, "no such file"),
    "empty": ("", "is empty"),
    "unknown": ("hello, world\nthis is, no trace\n", "is no workload format"),
    "not json": ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n{oops\n',
                 "line 2: not JSON"),
    "mixed": ('{"timestamp": 0, "input_length": 5, "output_length": 2}\n'
              '{"prompt": "hi"}\n', "line 2: a custom prompt record in a timed trace"),
    "negative": ('{"timestamp": 0, "input_length": -5, "output_length": 2}\n',
                 "line 1: input_length must be >= 1, got -5"),
    "not a number": ('{"timestamp": 0, "input_length": 5, "output_length": "two"}\n',
                     "line 1: output_length must be a whole number of tokens, got 'two'"),
    "no key": ('{"timestamp": 0, "input_length": 5}\n', "line 1: no output_length"),
    "backwards": ('{"timestamp": 10, "input_length": 5, "output_length": 2}\n'
                  '{"timestamp": 3, "input_length": 5, "output_length": 2}\n',
                  "line 2: the timestamp goes backwards"),
    "csv backwards": ("Timestamp,Request tokens,Response tokens\n5,10,2\n4.5,10,2\n",
                      "line 3: the timestamp goes backwards"),
    "csv not a number": ("Timestamp,Request tokens,Response tokens\n5,ten,2\n",
                         "line 2: Request tokens must be a whole number of tokens"),
    "csv no output column": ("Timestamp,Request tokens,Model\n5,10,GPT-4\n",
                             "is no workload format"),
    "sharegpt entry": ('[{"conversations": [{"value": "hi"}]}]',
                       "line 1: needs 'conversations'"),
    "too long": ('{"timestamp": 0, "input_length": 900, "output_length": 200}\n'
                 '{"timestamp": 1, "input_length": 10, "output_length": 2}\n',
                 "1 request(s), input + output after length_scale and caps, exceed "
                 "max_model_len 1024: line 1 (1,100 tokens)"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_malformed_file_is_refused_before_any_engine(tmp_path: Path, case: str) -> None:
    text, expected = BAD[case]
    name = "w.csv" if case.startswith("csv") else "w.json" if "sharegpt" in case else "w.jsonl"
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(P.ParamsError) as e:
        _params(path)
    msg = str(e.value)
    assert "load.file" in msg and name in msg and expected in msg, msg


def test_keys_that_do_not_fit_the_file_are_refused(tmp_path: Path) -> None:
    files = _small_files(tmp_path)
    with pytest.raises(P.ParamsError, match=r"load.speeds: prompts.jsonl is a custom file"):
        _params(files["custom"][0], speeds=[1, 2])
    with pytest.raises(P.ParamsError, match=r"load.window_s: must be \[start, end\]"):
        _params(files["timed_trace"][0], window_s=[5, 1])
    with pytest.raises(P.ParamsError, match=r"load.speeds\[1\]: must be a number > 0"):
        _params(files["timed_trace"][0], speeds=[1, 0])
    with pytest.raises(P.ParamsError, match=r"load.window_s: belongs to a workload file"):
        P.parse({"experiment": "w", "model": "qwen3-tiny", "load": {"window_s": [0, 1]}})
    with pytest.raises(P.ParamsError, match=r"load.goodput.ttft: unknown bound"):
        _params(files["timed_trace"][0], goodput={"ttft": 5})
    with pytest.raises(P.ParamsError, match=r"no request in window_s \[50, 60\)"):
        _params(files["timed_trace"][0], window_s=[50, 60], time_unit_s=1)


def test_a_file_that_changes_after_planning_is_not_sent(tmp_path: Path) -> None:
    path, load = _small_files(tmp_path)["timed_trace"]
    point = make_plan(_params(path, **load)).runs[0].point
    path.write_text(path.read_text().replace('"output_length": 4', '"output_length": 5'))
    with pytest.raises(ValueError, match="changed since the sweep was planned"):
        point.workload.path()


def test_slo_attainment_counts_failed_requests_as_not_met() -> None:
    """vLLM's per-request rule (TPOT = (e2el - ttft) / (output - 1), bounds with <=); the share
    is of every request sent."""
    result = {"ttfts": [0.1, 0.5, 0.1, 0.0], "latencies": [1.0, 1.0, 3.0, 0.0],
              "output_lens": [10, 10, 11, 0], "errors": ["", "", "", "boom"]}
    # request 0: ttft 100 ms, tpot 100 ms -> good; 1: ttft 500 -> not; 2: tpot 290 -> not
    assert client.slo_attainment(result, "ttft:200 tpot:100") == 0.25
    assert client.slo_attainment(result, "ttft:600") == 0.75


@pytest.mark.skipif(not SHARED.is_dir(), reason="the full shared traces are not beside this "
                                                "checkout")
def test_the_full_shared_traces_read() -> None:
    for path, n in ((SHARED / "azure-llm-inference-2023-conv.csv", 19366),
                    (SHARED / "mooncake-fast25-conversation-head3000.jsonl", 3000)):
        fmt, reqs = F.read(path)
        assert len(reqs) == n and fmt.timed


def test_the_profile_draws_what_was_asked_beside_what_was_sent() -> None:
    """The profile chart of a trace window: arrivals per bin with the empty bins at 0 (a step
    line must not carry a count across a gap), lengths as shares of the requests."""
    from tunebook.charts import plots
    from tunebook.results import workload

    p = R.prepare(R.Replay(MOONCAKE, window_s=(0, 20), length_scale=0.25, max_input_len=640))
    asked = workload.asked(p.records, speed=4.0)
    assert asked["arrival_s"].max() <= 5.0 and asked["shared_blocks"].sum() > 0
    sent = asked.rename(columns={"arrival_s": "start_s"}).assign(failed=False)
    spec = plots.workload_profile(asked, sent, "test").to_dict()
    arrivals = next(d for name, d in spec["datasets"].items()
                    if d and "req_s" in d[0] and d[0]["which"] == plots.ASKED)
    bins = sorted(r["bin_s"] for r in arrivals)
    steps = {round(b - a, 6) for a, b in zip(bins, bins[1:], strict=False)}
    assert len(steps) == 1  # every bin between the first and the last, empty ones at 0
    assert sum(r["requests"] for r in arrivals) == len(asked)
    with pytest.raises(ValueError, match="nothing to profile"):
        plots.workload_profile(asked.iloc[:0], sent.iloc[:0], "empty")


def test_the_profile_of_a_file_without_arrival_times() -> None:
    """A prompt file (custom JSONL, ShareGPT) has no clock: the arrivals drawn are those vLLM's
    client sent (users or request_rate set them), the lengths asked are the file's output
    lengths (its prompts are text: their tokens are counted by the server, in `sent`)."""
    from tunebook.charts import plots
    from tunebook.results import workload

    asked = workload.asked([{"prompt": f"p{i}", "output_tokens": 16} for i in range(10)])
    assert asked["arrival_s"].isna().all() and asked["input_len"].isna().all()
    sent = pd.DataFrame({"request": range(10), "start_s": [i * 0.5 for i in range(10)],
                         "input_len": [20] * 10, "output_len": [16] * 10, "failed": False})
    spec = plots.workload_profile(asked, sent, "a prompt file").to_dict()
    drawn = {(("arrivals" if "req_s" in d[0] else "lengths"), d[0]["which"])
             for d in spec["datasets"].values() if d}
    assert drawn == {("arrivals", plots.SENT), ("lengths", plots.SENT),
                     ("lengths", plots.ASKED)}


@pytest.mark.replot("cpu-traces")
def test_the_trace_chapter_on_stored_rows(replots) -> None:
    """notebooks/30_traces on the committed CPU replays (no engine starts): per trace its
    profile (asked beside sent), its runs with goodput and prefix-cache hits, offline HTML."""
    from tunebook.present import report

    r = replots["cpu-traces"]
    rc, out = r.wait()
    assert rc == 0, out
    assert sorted((r.exp / "engines").iterdir()) == r.engine_logs_before, out  # none started
    html = (r.exp / "report.html").read_text()
    assert not report.external_resources(html)
    for text in ("asked and sent", "azure-conv-2023-first180s.csv", "hits predicted",
                 "Converted: CSV trace written as vLLM timed_trace records",
                 "mooncake-conversation-first180s.jsonl", "Goodput bounds (ms)"):
        assert text in html, text


def test_a_client_without_the_dataset_is_said_before_any_engine(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A client without timed_trace (one older than vLLM 0.26: 0.26 and 0.32 have it) cannot
    replay a trace: params refuses it, naming the installed client and the datasets it has,
    instead of failing in the client after an engine start."""
    from tunebook.core import hardware

    monkeypatch.setattr(hardware, "vllm_client_datasets",
                        lambda: frozenset({"random", "sharegpt", "custom", "burstgpt"}))
    monkeypatch.setattr(hardware, "vllm_package", lambda: "vllm 0.11.0")
    with pytest.raises(P.ParamsError, match=r"load.file: mooncake-conversation-first180s.jsonl: "
                                            r"the installed vLLM's benchmark client \(vllm "
                                            r"0.11.0\) has no timed_trace dataset \(vLLM 0.26 "
                                            r"and 0.32 have it\), only burstgpt, custom, random, "
                                            r"sharegpt: it cannot send this file here"):
        _params(MOONCAKE, window_s=[0, 10])


# The --dataset-name choices of vLLM 0.26.0's client, as its wheel (the H200 bundle) has them in
# vllm/benchmarks/datasets/datasets.py
VLLM_026_CHOICES = """
    parser.add_argument(
        "--dataset-name",
        type=str,
        default="random",
        choices=[
            "sharegpt", "burstgpt", "sonnet", "random", "random-mm", "random-rerank", "hf",
            "custom", "custom_audio", "custom_image", "prefix_repetition", "spec_bench",
            "speed_bench", "timed_trace",
        ],
        help="Name of the dataset to benchmark on.",
    )
"""


def test_the_clients_datasets_are_read_from_its_source() -> None:
    """The choices are read from the source (vLLM is not imported): vLLM 0.26's and the
    installed client's both have timed_trace, so both replay a trace on its clock."""
    from tunebook.core import hardware

    assert hardware.dataset_choices(VLLM_026_CHOICES) == {
        "sharegpt", "burstgpt", "sonnet", "random", "random-mm", "random-rerank", "hf",
        "custom", "custom_audio", "custom_image", "prefix_repetition", "spec_bench",
        "speed_bench", "timed_trace"}
    assert hardware.dataset_choices("no parser here") is None
    installed = hardware.vllm_client_datasets()
    assert installed is None or {"timed_trace", "custom", "sharegpt"} <= installed
