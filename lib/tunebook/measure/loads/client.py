"""vLLM's own benchmark client as a load kind (tunebook.measure.client): every dataset vLLM's
`bench serve` sends — random, prefixes, prompt sets, workload files replayed on their clock."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tunebook.inputs.load import PROMPT_DATASETS, LoadPoint, bench_argv
from tunebook.measure.client import metrics_row, request_arrays, run_bench
from tunebook.measure.loads.base import LoadKind, Sent
from tunebook.servers.base import SERVED_NAME, Server

if TYPE_CHECKING:
    from tunebook.inputs.plan import PlannedRun
    from tunebook.measure.context import PointContext

CLIENT_STEPS = {"client_s": "client (vLLM's, whole call)",
                "client_import_s": "client: import vllm.benchmarks.serve",
                "client_tokenizer_s": "client: tokenizer",
                "client_samples_s": "client: dataset sampling"}


def _said(error: str) -> str:
    """What a failed request died of: the last line of its traceback ("Type: message"), or
    the server's own words (vLLM's client stores a traceback, or a reason like 'Bad Request')."""
    lines = [ln.strip() for ln in error.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else error.strip()


def error_summary(res: dict) -> str | None:
    """The failed requests of a run in a few words: the first one's exception and message,
    and, when they died of several things, how many of each (`2x ServerDisconnectedError,
    1x TimeoutError`). None when no request failed; the tracebacks stay in the run's JSON."""
    said = [_said(e) for e in res.get("errors", []) if e]
    if not said:
        return None
    kinds = Counter(s.split(":", 1)[0].rsplit(".", 1)[-1] for s in said)
    if len(kinds) == 1:
        return said[0]
    return said[0] + " (" + ", ".join(f"{n}x {k}" for k, n in kinds.most_common()) + ")"


class VllmClient(LoadKind):
    name = "vllm-client"
    uses_vllm_client = True

    def claims(self, point: LoadPoint) -> bool:
        return True  # whatever no other kind claims: vLLM's client sends it

    def send(self, server: Server, run: PlannedRun, ctx: PointContext, seed: int | None,
             timings: dict[str, float]) -> Sent:
        res, printed = self._bench(server, run, ctx, seed, timings)
        texts = run.point.dataset in PROMPT_DATASETS
        extra = {"requests": request_arrays(res, texts), "bench_output": printed[-4000:]}
        try:
            metrics = metrics_row(res, run.point)
        except Exception as e:  # noqa: BLE001 - a result tunebook cannot read: a failed row,
            # with vLLM's arrays kept for a later reading, not a crashed sweep
            return Sent(None, extra, (f"tunebook could not read vLLM's result: "
                                      f"{type(e).__name__}: {e} (its keys: "
                                      f"{', '.join(sorted(res))})")[:500])
        error = None
        if not metrics.get("completed"):
            error = (error_summary(res) or "no request completed")[:500]
        elif metrics.get("failed_requests"):
            # vLLM's metrics leave failed requests out: the numbers would flatter this run
            error = (f"{metrics['failed_requests']} request(s) failed: "
                     f"{error_summary(res)}")[:500]
        return Sent(metrics, extra, error, result=res)

    @staticmethod
    def _bench(server: Server, run: PlannedRun, ctx: PointContext, seed: int | None,
               timings: dict[str, float]) -> tuple[dict, str]:
        """vLLM's benchmark client on the server; its steps into the run's timings."""
        assert ctx.model is not None, "the executor sets each config's model"
        argv = bench_argv(run.point, server.base_url, SERVED_NAME, ctx.model.tokenizer, seed)
        client: dict[str, float] = {}
        try:
            return run_bench(argv, api_key=server.api_key,
                             timeout_s=ctx.params.run_timeout_for(run.part), cache=ctx.client,
                             timings=client, death=server.death)
        finally:
            timings.update(client)
            for key, step in CLIENT_STEPS.items():
                if key in client:
                    ctx.steps.add(step, client[key])
