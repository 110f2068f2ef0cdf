"""The peer engine (tunebook.servers.sglang, issue 17) where no SGLang is needed: the knob
mapping and its refusals, engine_kind validated like every knob before anything starts, the launcher
shim that keeps the API key off the command line, and Figs 5.2/5.3's rules on SYNTHETIC rows
(made-up numbers with known answers, not measurements). SGLang has no CPU build: on this
machine a config of it is refused before any engine starts, and the peer figures say so."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import LIB
from tunebook import figures
from tunebook.inputs import params as P
from tunebook.inputs.plan import make_plan
from tunebook.measure.sweep import Sweep, SweepOptions
from tunebook.models.presets import ModelRef
from tunebook.results.evidence import CANNOT, DIFFERS, HOLDS, NOT_MEASURED, Evidence
from tunebook.servers import sglang as peer
from tunebook.servers.sglang import SGLangServer
from tunebook.servers.start_phases import parse_phases, running_phase

BASE = {"experiment": "x", "model": "qwen3-tiny", "load": {"users": [1]}}


def _problems(**grid_entry) -> str:
    with pytest.raises(P.ParamsError) as e:
        P.parse({**BASE, "engine_grid": [{}, grid_entry]})
    return str(e.value)


def test_knobs_map_onto_sglang_flags() -> None:
    flags = peer.sglang_flags({"engine_kind": "sglang", "max_num_seqs": 8,
                               "max_num_batched_tokens": 2048, "max_model_len": 4096,
                               "gpu_memory_utilization": 0.85, "enforce_eager": True,
                               "enable_prefix_caching": False, "kv_cache_dtype": "fp8",
                               "quantization": "fp8", "attention_backend": "TRITON_ATTN"})
    assert flags == ["--max-running-requests", "8", "--chunked-prefill-size", "2048",
                     "--max-prefill-tokens", "2048", "--context-length", "4096",
                     "--mem-fraction-static", "0.85", "--cuda-graph-backend-decode", "disabled",
                     "--cuda-graph-backend-prefill", "disabled", "--disable-radix-cache",
                     "--kv-cache-dtype", "fp8_e4m3", "--quantization", "fp8",
                     "--attention-backend", "triton"]
    # vLLM's defaults are SGLang's defaults: no flag
    assert peer.sglang_flags({"enforce_eager": False, "enable_prefix_caching": True,
                              "enable_chunked_prefill": True, "seed": None}) == []
    assert peer.sglang_flags({"enable_chunked_prefill": False}) == ["--chunked-prefill-size",
                                                                   "-1"]
    # every knob of the table is mapped or refused with a reason, none silently dropped
    from tunebook.core.knobs import KNOBS
    assert set(KNOBS) == set(peer.SGLANG_FLAGS) | set(peer.REFUSED) | {"engine_kind", "model"}


def test_knobs_without_an_sglang_equivalent_are_refused_before_a_start() -> None:
    text = _problems(engine_kind="sglang", kv_cache_memory_bytes=2**30)
    assert "engine_grid[1].kv_cache_memory_bytes: has no SGLang equivalent" in text
    assert "gpu_memory_utilization" in text  # says what to use instead
    assert "speculative_config: has no SGLang equivalent" in _problems(
        engine_kind="sglang",
        speculative_config={"method": "ngram", "num_speculative_tokens": 3})
    assert "'fp8_inc' has no SGLang equivalent" in _problems(engine_kind="sglang",
                                                             kv_cache_dtype="fp8_inc")
    assert "must be one of ('vllm', 'sglang')" in _problems(engine_kind="SGLang")
    # the same knobs on vLLM are fine
    P.parse({**BASE, "engine_grid": [{"kv_cache_memory_bytes": 2**30}]})


def test_engine_kind_in_the_base_and_the_grid() -> None:
    p = P.parse({**BASE, "engine": {"max_num_seqs": 4},
                 "engine_grid": [{}, {"engine_kind": "sglang"}]})
    engines = make_plan(p).engines
    assert [peer.kind_of(e.knobs) for e in engines] == ["vllm", "sglang"]
    assert engines[1].label == "engine_kind=sglang"
    # a vLLM config keeps its id (engine_kind unset is not in it): stored runs stay resumable
    alone = make_plan(P.parse({**BASE, "engine": {"max_num_seqs": 4}})).engines[0]
    assert engines[0].id == alone.id
    assert "SGLang cannot be one of them" in _problems(
        engine_kind="sglang", disaggregate={"prefill": {}, "decode": {}})


def test_the_server_command_line_holds_no_key(tmp_path: Path) -> None:
    model = ModelRef("m", str(tmp_path / "m"), str(tmp_path / "m"), "dummy")
    argv = SGLangServer(model, {"engine_kind": "sglang", "max_num_seqs": 4}).build_argv(8123)
    assert argv[1:3] == ["-m", peer.LAUNCHER]
    assert argv[argv.index("--host") + 1] == "127.0.0.1"  # loopback only
    assert "--api-key" not in argv and "--load-format" in argv and "--enable-metrics" in argv
    # the shim hands the key to sglang.launch_server in its own argv, not on the command line
    fake = tmp_path / "sglang"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "launch_server.py").write_text(
        "import os, sys\nprint(repr(sys.argv[1:]), sys.argv[-1] == 'secret-key')\n"
        "print(open(f'/proc/{os.getpid()}/cmdline').read().count('secret-key'))\n"
        "print(os.environ.get('TUNEBOOK_SGLANG_API_KEY'))\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(tmp_path), str(LIB))),
           peer.KEY_ENV: "secret-key"}
    out = subprocess.run([sys.executable, "-m", peer.LAUNCHER, "--port", "1"], env=env,
                         capture_output=True, text=True, check=True).stdout.splitlines()
    # (the key is in the server's argv; whatever the server prints has it masked)
    assert out == ["['--port', '1', '--api-key', '***'] True", "0", "None"]


def test_sglang_is_refused_here_before_any_engine_starts(tmp_path: Path) -> None:
    if peer.installed("sglang"):
        pytest.skip("SGLang is installed here")
    p = P.parse({**BASE, "engine_grid": [{}, {"engine_kind": "sglang"}]})
    with pytest.raises(peer.EngineNotInstalledError, match="sglang: not installed"):
        Sweep(p, tmp_path, SweepOptions(progress=False)).run()
    assert not (tmp_path / "x" / "runs").exists()  # nothing ran, nothing was written


# Lines built from SGLang 0.5.17's own format strings (see tunebook.servers.sglang) with made-up
# values:
# the format is SGLang's, the numbers are not a measurement. Real H200 logs replace them when
# the peer first runs there.
SGLANG_START = """tunebook: sglang 0.5.17
[2026-12-05 10:00:00] server_args=ServerArgs(model_path='/m', attention_backend='fa3', \
context_length=8192)
[2026-12-05 10:00:08] Load weight begin. avail mem=138.52 GB
[2026-12-05 10:00:12] Load weight end. elapsed=3.87 s, type=Qwen3ForCausalLM, avail mem=123.19 GB, \
mem usage=15.33 GB.
[2026-12-05 10:00:12] KV Cache is allocated. dtype: torch.bfloat16, #tokens: 771,234, K size: \
52.97 GB, V size: 52.97 GB
[2026-12-05 10:00:12] Memory pool end. avail mem=15.41 GB
[2026-12-05 10:00:14] Capture target prefill CUDA graph end. elapsed=2.10 s, mem usage=0.40 GB, \
avail mem=15.00 GB.
[2026-12-05 10:00:20] Capture target decode CUDA graph end. elapsed=6.41 s, mem usage=0.52 GB, \
avail mem=14.40 GB.
[2026-12-05 10:00:20] max_total_num_tokens=771234, chunked_prefill_size=8192, \
max_prefill_tokens=16384, max_running_requests=4096, context_len=8192, available_gpu_mem=14.38 GB
[2026-12-05 10:00:23] The server is fired up and ready to roll!
""".replace("\\\n", "")


def test_sglang_start_up_facts_fill_the_same_columns() -> None:
    f = peer.parse_startup(SGLANG_START)
    assert (f.sglang_version, f.attention_backend, f.weights_gib) == ("0.5.17", "fa3", 15.33)
    assert (f.kv_pool_tokens, f.kv_cache_gib, f.cuda_graph_gib) == (771234, 105.94, 0.92)
    assert f.max_concurrency_x == pytest.approx(771234 / 8192, abs=0.01)
    assert f.vllm_version is None  # not a vLLM row
    assert peer.parse_startup("") == peer.parse_startup("unrelated")  # missing: None, no error


REAL_LOG = Path(__file__).resolve().parents[1] / "data" / "logs" / "sglang-0.5.17-h200-qwen3-8b.log"


def test_start_up_facts_from_a_real_sglang_log() -> None:
    """SGLang 0.5.17 on the lent H200 (outputs/h200/ch05-peer): the numbers are the log's own
    lines ('Load weight end … mem usage=15.28 GB', 'KV Cache is allocated … #tokens: 803516,
    K size: 55.17 GB, V size: 55.17 GB', the two CUDA graph captures' 'mem usage')."""
    f = peer.parse_startup(REAL_LOG.read_text())
    assert (f.sglang_version, f.attention_backend, f.weights_gib) == ("0.5.17", "fa3", 15.28)
    assert (f.kv_pool_tokens, f.kv_cache_gib) == (803516, 110.34)
    assert f.cuda_graph_gib == pytest.approx(1.44 + 0.21)
    assert f.max_concurrency_x == pytest.approx(803516 / 8192, abs=0.01)


def test_an_sglang_start_phase_by_phase_from_a_real_log() -> None:
    """The same phase columns as a vLLM start, cut at SGLang's lines (its own stamps,
    "[2026-12-04 12:30:16]"); they add up to tunebook's spawn → /health time (the log's ready
    line, 150.808 s). The graph captures' own elapsed (76.89 + 5.84 s) beside them."""
    text = REAL_LOG.read_text()
    ph = parse_phases(text, engine="sglang")
    assert ph.total_s == pytest.approx(150.808, abs=1e-3) and not ph.missing
    assert ph.start_compile_s is None and ph.compile_cache is None  # SGLang compiles nothing
    assert ph.start_cuda_graphs_s == pytest.approx(82, abs=1)  # ±1 s: stamps are whole seconds
    assert (ph.weights_took_s, ph.cuda_graphs_took_s) == (0.15, pytest.approx(76.89 + 5.84))
    assert max(ph.seconds(), key=ph.seconds().get) == "cuda_graphs"
    cut = [running_phase(text[:text.index("\n", text.index(line))], "sglang") for line in (
        "tunebook: sglang", "Attention backend not specified", "Load weight begin",
        "Memory pool end", "Capture target decode CUDA graph end", "fired up")]
    assert cut == ["importing SGLang", "starting the scheduler", "loading weights",
                   "capturing CUDA graphs", "warming up", "starting the API server"]


def test_a_clean_sglang_stop_is_not_diagnosed_as_a_setting() -> None:
    """The real log ends in SGLang's own shutdown lines ('Subprocess scheduler_0 … crashed with
    exit code -15', 'SIGQUIT received … It usually means one child failed'): none of the
    SGLang failure rules may read them as a setting to change."""
    from tunebook.servers.startup import diagnose

    d = diagnose(REAL_LOG.read_text(), {"engine_kind": "sglang"})
    assert d.setting is None and d.suggested is None


@pytest.mark.parametrize(("line", "setting", "value"), [
    ("RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current "
     "value: mem_fraction_static=0.5", "gpu_memory_utilization", 0.9),
    ("ValueError: Loaded weights leave no GPU memory for the KV cache under "
     "--mem-fraction-static=0.1. Raise --mem-fraction-static above 0.134 (minimum viable = 1 - "
     "available/pre = 0.1340).", "gpu_memory_utilization", 0.18),
    ("ValueError: Warning: User-specified context_length (200000) is greater than the derived "
     "context_length (40960). This may lead to incorrect model outputs", "max_model_len", 40960),
    ("Exception: Capture cuda graph failed: CUDA out of memory", "gpu_memory_utilization", 0.75),
    ("ModuleNotFoundError: No module named 'sgl_kernel'", None, None),
])
def test_sglang_failed_starts_are_diagnosed(line: str, setting: str | None, value: object) -> None:
    from tunebook.servers.startup import diagnose

    d = diagnose(f"[2026-12-05 10:00:12] Scheduler hit an exception: Traceback\n{line}\n",
                 {"engine_kind": "sglang", "gpu_memory_utilization": 0.85})
    assert (d.setting, d.suggested) == (setting, value)
    assert d.line == line and ("SGLang" in d.error)


LOGS = Path(__file__).resolve().parents[1] / "data" / "logs"


@pytest.mark.parametrize(("log", "knobs", "setting", "value", "cause"), [
    # --context-length 200000 on Qwen3-8B (40,960): SGLang refuses it while parsing its
    # arguments, before the scheduler starts (23 s)
    ("sglang-0.5.17-h200-context-length-200000.log", {"max_model_len": 200000},
     "max_model_len", 40960, "ValueError: Warning: User-specified context_length (200000)"),
    # --mem-fraction-static 0.1 of the H200: the 15.3 GiB of weights fill it; SGLang prints the
    # floor (0.111), tunebook adds 0.05 of headroom (after the weights load, 49 s)
    ("sglang-0.5.17-h200-mem-fraction-0.1.log", {"gpu_memory_utilization": 0.1},
     "gpu_memory_utilization", 0.16, "ValueError: Loaded weights leave no GPU memory"),
])
def test_real_failed_sglang_starts_are_diagnosed(log: str, knobs: dict, setting: str,
                                                 value: object, cause: str) -> None:
    """Two starts that failed on the lent H200 (params/ch05-peer-faults-h200.yaml, logs as the
    shim wrote them, key masked): the cause is the traceback's own last line, and the setting
    to change is computed from the numbers SGLang printed."""
    from tunebook.servers.startup import diagnose

    text = (LOGS / log).read_text()
    assert "api_key='***'" in text or "api_key" not in text  # the shim masked the key
    d = diagnose(text, {"engine_kind": "sglang", **knobs})
    assert (d.setting, d.suggested) == (setting, value)
    assert d.line is not None and d.line.startswith(cause)
    assert d.error.startswith("SGLang:")


def _ev(rows: list[dict], gpu: str | None = "NVIDIA H200") -> Evidence:
    base = {"status": "ok", "hardware": gpu or "test box", "gpu_name": gpu,
            "request_rate": None, "prefix_len": 0, "model": "qwen3-8b"}
    return Evidence(Path("/nonexistent/exp"), pd.DataFrame([{**base, **r} for r in rows]), [],
                    {"model": "qwen3-8b", "gpu_name": gpu})


def _peer_rows(tok: dict[int, tuple[float, float]], itl: dict[int, tuple[float, float]]
               ) -> list[dict]:
    rows = []
    for users, (v, s) in tok.items():
        rows += [{"engine_config_id": "v", "engine_label": "default", "engine_kind": None,
                  "max_concurrency": users, "output_tok_s": v, "p99_itl_ms": itl[users][0]},
                 {"engine_config_id": "s", "engine_label": "engine_kind=sglang",
                  "engine_kind": "sglang", "max_concurrency": users, "output_tok_s": s,
                  "p99_itl_ms": itl[users][1]}]
    return rows


def test_5_2_and_5_3_rules_on_synthetic_rows() -> None:
    tok = {1: (100, 101), 8: (790, 800), 32: (2000, 2040), 64: (2500, 3000)}
    itl = {1: (10, 9), 8: (12, 10), 32: (50, 20), 64: (80, 30)}
    ev = _ev(_peer_rows(tok, itl))
    c = figures.verdict(ev, "5.2")  # the 64-user gap lies past the manual's 32
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(100 * (1 - 2000 / 2040))
    tok[8] = (700, 800)
    c = figures.verdict(_ev(_peer_rows(tok, itl)), "5.2")
    assert c.verdict == DIFFERS and "at 8 users" in c.measured
    assert "noise is not measured" in c.why  # one run per engine and load
    c = figures.verdict(ev, "5.3")
    assert c.verdict == HOLDS and c.measured_value == pytest.approx(2.5)
    itl[32] = (30, 20)
    assert figures.verdict(_ev(_peer_rows(tok, itl)), "5.3").verdict == DIFFERS
    for fig in ("5.2", "5.3"):
        assert figures.get(fig).chart(ev).to_dict()
        vllm_only = [r for r in _peer_rows(tok, itl) if r["engine_kind"] is None]
        assert figures.verdict(_ev(vllm_only), fig).verdict == NOT_MEASURED
        c = figures.verdict(_ev(vllm_only, gpu=None), fig)
        assert c.verdict == CANNOT and "SGLang has no CPU build" in c.why


def test_an_sglang_folder_for_the_server_alone_counts_as_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the device's SGLang bundle sits beside the vLLM one, on the SGLang server's path only
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    monkeypatch.setenv(peer.PATH_ENV, str(tmp_path))
    assert peer.installed("sglang")
    peer.require_installed([{"engine_kind": "sglang"}])


_FAKE_SERVER = '''
import signal, subprocess, sys, time
key = sys.argv[sys.argv.index("--api-key") + 1]
print(f"server_args=ServerArgs(model_path='/m', api_key={key!r}, port=1)", flush=True)
print("x" * 65530 + key + " split across two reads", flush=True)  # crosses the 64 KiB read
subprocess.run([sys.executable, "-c", "import sys; print('child:', sys.argv[1])", key])
if "--die-by-kill" in sys.argv:
    import os
    os.kill(os.getpid(), signal.SIGKILL)
if "--wait" in sys.argv:
    signal.signal(signal.SIGTERM, lambda *_: (print("SIGTERM reached the server", flush=True),
                                               sys.exit(0)))
    print("waiting", flush=True)
    time.sleep(60)
sys.exit(3)
'''


def _shim(tmp_path: Path, *args: str) -> subprocess.Popen:
    (tmp_path / "fake_sglang_server.py").write_text(_FAKE_SERVER)
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{LIB}",
           peer.KEY_ENV: "k3y-Zq8w7XyP0s9a", "TUNEBOOK_SGLANG_MODULE": "fake_sglang_server"}
    return subprocess.Popen([sys.executable, "-m", peer.LAUNCHER, "--port", "1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)


def test_the_shim_masks_the_key_in_everything_the_server_prints(tmp_path: Path) -> None:
    """SGLang prints ServerArgs with api_key='…' (seen in the H200 log): the shim masks the key
    in whatever the server and its child processes print, also across two reads, and exits
    with the server's status."""
    proc = _shim(tmp_path)
    out, _ = proc.communicate(timeout=60)
    text = out.decode()
    assert proc.returncode == 3
    assert "k3y-Zq8w7XyP0s9a" not in text
    assert "api_key='***'" in text and "***split" not in text and "*** split" in text
    assert "child: ***" in text


def test_the_shim_ends_as_the_server_ended(tmp_path: Path) -> None:
    """A server killed by a signal (the OOM killer's SIGKILL) leaves the shim killed by it too:
    tunebook still reads exit code -9, as without the shim."""
    import signal

    proc = _shim(tmp_path, "--die-by-kill")
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL


def test_the_shim_passes_a_stop_on_to_the_server(tmp_path: Path) -> None:
    """A SIGTERM to the shim alone (PR_SET_PDEATHSIG under Ray) reaches the server."""
    import signal
    import time

    proc = _shim(tmp_path, "--wait")
    assert proc.stdout is not None
    deadline = time.monotonic() + 60
    seen = b""
    while b"waiting" not in seen and time.monotonic() < deadline:
        seen += proc.stdout.readline()
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert b"SIGTERM reached the server" in seen + out and proc.returncode == 0


def test_stored_sglang_starts_are_cut_at_sglang_lines(tmp_path: Path) -> None:
    """Rows stored before their phases were recorded are read from the engine log: an SGLang
    row's log with SGLang's events, not vLLM's."""
    from tunebook.servers.start_phases import phases_frame

    (tmp_path / "engines").mkdir()
    (tmp_path / "engines" / "s.log").write_text(REAL_LOG.read_text())
    rec = {"row": {"engine_kind": "sglang", "engine_label": "engine_kind=sglang",
                   "startup_s": 150.808, "started_at": "2026-12-04T12:32:24"},
           "engine": {"log": "engines/s.log"}}
    row = phases_frame([rec], tmp_path).iloc[0]
    assert row["start_cuda_graphs_s"] == pytest.approx(82, abs=1)
    assert row["start_engine_core_s"] == pytest.approx(29, abs=1)
