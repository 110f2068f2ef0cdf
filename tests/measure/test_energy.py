"""The energy rule on recorded counter values (tunebook.measure.energy): the measured window
only, interpolated between samples; a wrapped counter unwrapped, a reset refused, a missing
counter said; the sampler with a counter that fails now and then."""

from __future__ import annotations

import time

import pytest

from tunebook.measure import energy as E


def _samples(values: list[int], dt: float = 1.0,
             t0: float = 100.0) -> list[tuple[float, list[int]]]:
    return [(t0 + i * dt, [v]) for i, v in enumerate(values)]


def test_the_window_between_samples_is_interpolated() -> None:
    # 200 W: 200 J = 200,000 mJ a second
    s = _samples([i * 200_000 for i in range(11)])
    joules, why = E.window_energy(s, 102.5, 107.25)
    assert why is None and joules == pytest.approx(200 * 4.75)


def test_only_the_window_counts_not_the_warm_ups_around_it() -> None:
    # idle 50 W for 5 s (warm-up, start-up), then 400 W for 5 s: the window is the second half
    values, total = [], 0
    for i in range(11):
        values.append(total)
        total += (50_000 if i < 5 else 400_000)
    joules, _ = E.window_energy(_samples(values), 105.0, 110.0)
    assert joules == pytest.approx(2000.0)
    whole, _ = E.window_energy(_samples(values), 100.0, 110.0)
    assert whole == pytest.approx(2250.0)  # what a before/after meter would say


def test_several_devices_add_up() -> None:
    s = [(100.0 + i, [i * 100_000, i * 300_000]) for i in range(5)]
    joules, _ = E.window_energy(s, 100.0, 104.0)
    assert joules == pytest.approx(4 * 400)


def test_a_wrapped_counter_is_unwrapped() -> None:
    top = E.WRAP_MJ - 150_000
    s = _samples([top - 100_000, top, (top + 100_000) % E.WRAP_MJ, (top + 200_000) % E.WRAP_MJ])
    joules, why = E.window_energy(s, 100.0, 103.0)
    assert why is None and joules == pytest.approx(300.0)


def test_a_reset_counter_gives_no_number_inside_the_window_only() -> None:
    s = _samples([5_000_000, 5_100_000, 1_000, 101_000, 201_000])
    joules, why = E.window_energy(s, 100.5, 103.0)
    assert joules is None and "went back" in why
    after, why = E.window_energy(s, 102.0, 104.0)  # the reset lies before the window
    assert why is None and after == pytest.approx(200.0)


def test_a_window_the_samples_do_not_cover_gives_no_number() -> None:
    s = _samples([0, 100_000, 200_000])
    for t0, t1 in ((99.0, 101.0), (100.5, 102.5)):
        joules, why = E.window_energy(s, t0, t1)
        assert joules is None and "whole measured window" in why
    assert E.window_energy([], 0, 1) == (None, "the energy counter was never read")


def test_the_measured_window_from_vllms_result() -> None:
    res = {"start_times": [10.0, 10.5, 11.0], "latencies": [2.0, 3.0, 1.0]}
    assert E.measured_window(res) == (10.0, 13.5)
    # vLLM 0.26: no latencies; TTFT plus the gaps
    old = {"start_times": [10.0, 10.5], "ttfts": [0.5, 0.25], "itls": [[0.1, 0.1], [1.0, 1.0]]}
    assert E.measured_window(old) == pytest.approx((10.0, 12.75))
    assert E.measured_window({}) is None


class Recorded:
    """A counter replaying recorded values; every third read fails as NVML may."""

    devices = [0]

    def __init__(self) -> None:
        self.reads, self.value, self.closed = 0, 0, False

    def read_mj(self) -> list[int]:
        self.reads += 1
        if self.reads % 3 == 0:
            raise RuntimeError("NVML: GPU is lost")
        self.value += 10_000
        return [self.value]

    def close(self) -> None:
        self.closed = True


def test_the_sampler_reads_until_the_end_and_keeps_going_past_a_failed_read() -> None:
    counter = Recorded()
    with E.EnergySampler(counter, interval_s=0.01) as s:
        # until it has read 6 times (4 samples, 2 failed reads), not for a fixed time: the
        # quick lane runs niced beside the engines, and 0.2 s once gave its thread 6 reads
        deadline = time.monotonic() + 30
        while counter.reads < 6 and time.monotonic() < deadline:
            time.sleep(0.01)
    # and once more at the end: a failed read does not stop it
    assert counter.closed and counter.reads >= 7 and len(s.samples) >= 5 and s.errors
    times = [t for t, _ in s.samples]
    assert times == sorted(times)
    res = {"start_times": [times[1]], "latencies": [times[-2] - times[1]]}
    out = E.row(s, res, output_tokens=10)
    assert out["energy_j"] > 0 and out["energy_per_output_tok_j"] == pytest.approx(
        out["energy_j"] / 10)
    assert out["mean_power_w"] == pytest.approx(out["energy_j"] / out["energy_window_s"])
    assert "energy_note" not in out


def test_no_counter_says_why() -> None:
    s = E.EnergySampler(None, "no GPU energy counter on this box: NVML did not start (x)")
    with s:
        pass
    assert E.row(s, {"start_times": [1.0], "latencies": [1.0]}, 5) == {
        "energy_note": "no GPU energy counter on this box: NVML did not start (x)"}
    assert set(E.ENERGY_COLUMNS) >= {"energy_j", "energy_note"}


def test_which_gpus_the_engine_may_use() -> None:
    assert E._devices(4, None) == [0, 1, 2, 3]
    assert E._devices(4, "2,3") == [2, 3]
    assert E._devices(4, "GPU-1234") == [0, 1, 2, 3]
    assert E._devices(2, "0,5") == [0]


def test_this_box_has_no_counter_and_says_so() -> None:
    counter, why = E.open_counter()
    if counter is not None:  # a GPU box: a counter that reads
        assert counter.read_mj() and why is None
        counter.close()
    else:
        assert why and ("NVML" in why or "GPU" in why)
