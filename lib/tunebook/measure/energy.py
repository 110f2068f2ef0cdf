"""Joules per output token: the device's energy counter over a run's measured window only.

NVIDIA GPUs count the energy they used since the driver loaded, in millijoules
(`nvmlDeviceGetTotalEnergyConsumption`, Volta and newer): what vLLM's own client reads
(vllm/benchmarks/lib/energy.py, `--energy-gpu-ids`). vLLM's meter reads it before and after the
whole benchmark call, warm-ups included. tunebook samples it every SAMPLE_EVERY_S while a point
runs and reads it at the two ends of the measured window by linear interpolation between
samples: from the first measured request sent to the last one finished (vLLM's `start_times`
and `latencies`, both on this process's perf_counter clock: the client runs in-process). The
engine's start-up and the point's warm-ups lie outside it.

Rules (tests/measure/test_energy.py, on recorded counter values):
- whole-device energy of every GPU the engine may use (CUDA_VISIBLE_DEVICES, else all), summed:
  another process busy on the same GPU counts too;
- the window must lie within the samples (one at or before its start, one at or after its end),
  else no number;
- a counter that goes back: a wrap of the 64-bit counter when the earlier value was within
  2**32 mJ of its top (2**64 is added), otherwise a reset (a driver reload): no number;
- no counter (no NVIDIA driver, a GPU without one): no number.
Where there is no number, `energy_note` says why; it is never 0.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tunebook.measure.client import e2e_latency

SAMPLE_EVERY_S = 0.1
WRAP_MJ = 2**64  # the counter is an unsigned 64-bit count of millijoules
NEAR_TOP_MJ = WRAP_MJ - 2**32  # an earlier value above this that comes back small: a wrap
ENERGY_COLUMNS = ("energy_j", "energy_per_output_tok_j", "mean_power_w", "energy_window_s",
                  "energy_note")


class EnergyCounter(Protocol):
    """Cumulative energy of each device, millijoules (one value per device, same order)."""

    devices: list[int]

    def read_mj(self) -> list[int]: ...

    def close(self) -> None: ...


class NvmlCounter:
    """NVML's energy counter of each GPU the engine may use (vLLM's vendored pynvml, the
    official nvidia-ml-py wrapper, so no extra dependency)."""

    def __init__(self, nvml: Any, devices: list[int]):
        self.nvml, self.devices = nvml, devices
        self.handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in devices]

    def read_mj(self) -> list[int]:
        return [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - nothing to do about a shutdown that fails
            pass


def _devices(count: int, visible: str | None) -> list[int]:
    """The NVML indices of the GPUs a process may use: CUDA_VISIBLE_DEVICES when it lists
    ordinals (NVML and CUDA count alike where CUDA_DEVICE_ORDER=PCI_BUS_ID, vLLM's default on
    one box), else every GPU."""
    if visible is None or not visible.strip():
        return list(range(count))
    try:
        ids = [int(v) for v in visible.split(",") if v.strip()]
    except ValueError:  # UUIDs: every GPU rather than a guess
        return list(range(count))
    return [i for i in ids if 0 <= i < count]


def open_counter(env: dict[str, str] | None = None) -> tuple[EnergyCounter | None, str | None]:
    """(the counter, None), or (None, why there is none)."""
    try:
        from vllm.third_party import pynvml as nvml
    except ImportError as e:
        return None, f"no NVML wrapper to read a GPU energy counter ({e})"
    try:
        nvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound and kin
        return None, f"no GPU energy counter on this box: NVML did not start ({e})"
    try:
        visible = (env or {}).get("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES"))
        devices = _devices(nvml.nvmlDeviceGetCount(), visible)
        if not devices:
            raise RuntimeError("no GPU visible to the engine")
        counter = NvmlCounter(nvml, devices)
        counter.read_mj()  # NVMLError_NotSupported on a GPU without the counter
        return counter, None
    except Exception as e:  # noqa: BLE001
        try:
            nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001
            pass
        return None, f"no GPU energy counter readable: {e}"


@dataclass
class EnergySampler:
    """Reads `counter` every `interval_s` on a daemon thread while a point runs (`with`):
    samples of (perf_counter seconds, total mJ per device). Without a counter it keeps `why`."""

    counter: EnergyCounter | None
    why: str | None = None
    interval_s: float = SAMPLE_EVERY_S
    samples: list[tuple[float, list[int]]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event, repr=False)
    _thread: threading.Thread | None = field(default=None, repr=False)

    def __enter__(self) -> EnergySampler:
        if self.counter is not None:
            self._read()
            self._thread = threading.Thread(target=self._loop, name="tunebook-energy",
                                            daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
        if self.counter is not None:
            self._read()
            self.counter.close()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._read()

    def _read(self) -> None:
        assert self.counter is not None
        t = time.perf_counter()
        try:
            self.samples.append((t, self.counter.read_mj()))
        except Exception as e:  # noqa: BLE001 - a missed sample is a gap, not a failed point
            self.errors.append(str(e)[:200])


def measured_window(result: dict[str, Any]) -> tuple[float, float] | None:
    """(first request sent, last request finished) of a vLLM benchmark result, perf_counter
    seconds: its `start_times` plus each request's e2e latency (`latencies`, else TTFT plus
    the inter-token gaps, as vLLM 0.26 gives them). None when the result has no times."""
    starts = result.get("start_times") or []
    ends = []
    for i, s in enumerate(starts):
        if s:  # a request that failed at once (no latency): it ended when it was sent
            ends.append(s + (e2e_latency(result, i) or 0.0))
    sent = [s for s in starts if s]
    if not sent or not ends:
        return None
    return min(sent), max(ends)


def _delta(a: int, b: int) -> int | None:
    """b - a of one device's counter; None for a reset."""
    if b >= a:
        return b - a
    if a >= NEAR_TOP_MJ:
        return b + WRAP_MJ - a
    return None


def window_energy(samples: Sequence[tuple[float, Sequence[int]]], t0: float,
                  t1: float) -> tuple[float | None, str | None]:
    """Joules used between t0 and t1 (all devices), from cumulative samples by linear
    interpolation; (None, why) where the samples cannot say."""
    if not samples:
        return None, "the energy counter was never read"
    if t1 < t0:
        return None, "the measured window is empty"
    times = [t for t, _ in samples]
    if t0 < times[0] or t1 > times[-1]:
        return None, "the energy counter was not read across the whole measured window"
    total_mj = 0.0
    for d in range(len(samples[0][1])):
        # the counter at t: the energy since the first sample, unwrapped, interpolated
        acc, run = [0.0], 0
        for (ta, a), (tb, b) in zip(samples, samples[1:], strict=False):
            step = _delta(a[d], b[d])
            if step is None and tb > t0 and ta < t1:
                return None, ("the energy counter went back during the measured window (a "
                              "driver reset?): no number")
            run += step or 0  # a reset outside the window does not count in it
            acc.append(float(run))
        total_mj += _at(times, acc, t1) - _at(times, acc, t0)
    return total_mj / 1000.0, None


def _at(times: list[float], acc: list[float], t: float) -> float:
    i = bisect.bisect_left(times, t)
    if times[i] == t or i == 0:
        return acc[i]
    (ta, ea), (tb, eb) = (times[i - 1], acc[i - 1]), (times[i], acc[i])
    return ea + (eb - ea) * (t - ta) / (tb - ta) if tb > ta else eb


def row(sampler: EnergySampler | None, result: dict[str, Any] | None,
        output_tokens: int | None) -> dict[str, Any]:
    """The row's energy columns for one run: numbers, or `energy_note` saying why not."""
    if sampler is None or sampler.counter is None:
        return {"energy_note": (sampler.why if sampler else None) or "not measured"}
    window = measured_window(result or {})
    if window is None:
        return {"energy_note": "the benchmark result has no request times"}
    joules, why = window_energy(sampler.samples, *window)
    if joules is None:
        return {"energy_note": why}
    seconds = window[1] - window[0]
    out: dict[str, Any] = {"energy_j": joules, "energy_window_s": seconds,
                           "mean_power_w": joules / seconds if seconds > 0 else None}
    if output_tokens:
        out["energy_per_output_tok_j"] = joules / output_tokens
    return {k: v for k, v in out.items() if v is not None}
