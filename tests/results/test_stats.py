"""Statistics on SYNTHETIC data with answers known by construction or by hand (no engine):
Student-t intervals, within noise, ratio intervals, the peak and the knee of a load sweep,
and the noise-aware verdicts of tunebook.results.evidence."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from tunebook.present import claims
from tunebook.results import evidence, stats
from tunebook.results.evidence import DIFFERS, HOLDS, NOISE, NOT_MEASURED, VERDICTS
from tunebook.results.stats import Interval

USERS = (1, 2, 4, 8, 16, 32, 64)


# --- Student's t ----------------------------------------------------------------------------
@pytest.mark.parametrize(("confidence", "df", "table"), [
    (0.95, 1, 12.7062), (0.95, 2, 4.3027), (0.95, 4, 2.7764), (0.95, 7, 2.3646),
    (0.95, 9, 2.2622), (0.95, 30, 2.0423), (0.99, 5, 4.0321), (0.90, 3, 2.3534),
    (0.95, 1000, 1.9623),
])
def test_t_quantile_matches_the_printed_table(confidence, df, table):
    assert stats.t_quantile(confidence, df) == pytest.approx(table, abs=1e-4)


@pytest.mark.parametrize(("confidence", "df"), [(0.95, 0), (1.0, 3), (0.0, 3), (0.95, 2.5)])
def test_t_quantile_refuses_nonsense(confidence, df):
    with pytest.raises(ValueError):
        stats.t_quantile(confidence, df)


# --- intervals --------------------------------------------------------------------------------
def test_interval_against_a_hand_computed_t_interval():
    # {2,4,4,4,5,5,7,9}: mean 5, sample sd 2.13809, t(0.975, 7) = 2.36462:
    # half width = 2.36462 * 2.13809 / sqrt(8) = 1.78749 (Excel's CONFIDENCE.T(0.05, sd, 8))
    iv = Interval.of([2, 4, 4, 4, 5, 5, 7, 9])
    assert iv.mean == 5 and iv.n == 8 and iv.std == pytest.approx(2.13809, abs=1e-5)
    assert iv.half_width == pytest.approx(1.78749, abs=1e-5)
    assert (iv.low, iv.high) == pytest.approx((5 - 1.78749, 5 + 1.78749), abs=1e-5)
    # {10, 12, 14}: sd 2, t(0.975, 2) = 4.30265: half width 4.30265 * 2 / sqrt(3) = 4.96827
    assert Interval.of([10, 12, 14]).half_width == pytest.approx(4.96827, abs=1e-5)
    assert Interval.of([10, 12, 14], confidence=0.9).half_width == pytest.approx(
        2.91999 * 2 / math.sqrt(3), abs=1e-4)


def test_one_run_has_no_interval_and_says_so():
    one = Interval.of([275.0, None, float("nan"), float("inf")])  # only 275 is a number
    assert one.n == 1 and one.mean == 275 and not one.known
    assert math.isnan(one.low) and math.isnan(one.high) and math.isnan(one.half_width)
    assert one.text("tok/s") == "275 tok/s (1 run, no interval)"
    none = Interval.of([])
    assert none.n == 0 and math.isnan(none.mean) and none.text() == "not measured"
    assert Interval.of([270, 275, 280]).text("tok/s") == "275 ± 12.4 tok/s (95% CI, 3 runs)"


def _rows(label, points, status="ok", **extra):
    """Results rows: points = {users: [output_tok_s of each repeat]}."""
    return [{"status": status, "engine_label": label, "max_concurrency": users, "repeat": i,
             "output_tok_s": v, **extra}
            for users, values in points.items() for i, v in enumerate(values)]


def test_summarize():
    df = pd.DataFrame(
        _rows("a", {1: [10.0, 12.0, 14.0], 2: [20.0]})
        + _rows("a", {1: [1000.0]}, status="failed")  # not ok: ignored
        + _rows("a", {4: [float("nan")]})  # ok but no value: no group
        + _rows("b", {1: [5.0, 5.0]}))
    df["max_num_seqs"] = [None] * 6 + [16.0, 16.0]  # an unset knob is a group of its own
    out = stats.summarize(df, ["engine_label", "max_concurrency"], "output_tok_s")
    assert list(out.columns) == ["engine_label", "max_concurrency", *stats.SUMMARY_COLUMNS]
    a1 = out[(out.engine_label == "a") & (out.max_concurrency == 1)].iloc[0]
    assert a1["n"] == 3 and a1["mean"] == 12
    assert a1["half_width"] == pytest.approx(4.96827, abs=1e-5)
    assert (a1["ci_low"], a1["ci_high"]) == pytest.approx((12 - 4.96827, 12 + 4.96827), abs=1e-5)
    a2 = out[(out.engine_label == "a") & (out.max_concurrency == 2)].iloc[0]
    assert a2["n"] == 1 and a2["mean"] == 20 and a2[["std", "ci_low", "ci_high",
                                                      "half_width"]].isna().all()
    assert len(out) == 3  # a@1, a@2, b@1: the failed row and the NaN row make no group
    b1 = out[out.engine_label == "b"].iloc[0]
    assert b1["half_width"] == 0  # identical repeats: a zero-width interval, honestly
    knob = stats.summarize(df, ["max_num_seqs"], "output_tok_s")
    assert knob["max_num_seqs"].isna().sum() == 1 and set(knob["n"]) == {4, 2}
    assert stats.Interval.from_row(a1) == Interval.of([10, 12, 14])
    empty = stats.summarize(df.iloc[0:0], ["engine_label"], "output_tok_s")
    assert empty.empty and list(empty.columns) == ["engine_label", *stats.SUMMARY_COLUMNS]
    with pytest.raises(ValueError, match="lacks columns"):
        stats.summarize(df, ["no_such"], "output_tok_s")


def test_interval_selects_rows():
    df = pd.DataFrame(_rows("default", {32: [270.0, 275.0, 280.0]})
                      + _rows("cap", {32: [170.0, 174.0]}, max_num_seqs=16))
    df["request_rate"] = 2.0  # float column: 2 matches 2.0
    assert stats.interval(df, "output_tok_s", {"max_num_seqs": None}).mean == 275
    assert stats.interval(df, "output_tok_s", {"max_num_seqs": 16}).n == 2
    assert stats.interval(df, "output_tok_s", {"engine_label": "cap", "request_rate": 2,
                                               "max_concurrency": 32}).mean == 172
    assert stats.interval(df, "output_tok_s", {"engine_label": "none"}).n == 0


# --- within noise and ratios -------------------------------------------------------------------
def test_within_noise_both_ways():
    a = Interval.of([270, 275, 280])  # 275 ± 12.4
    near = Interval.of([280, 285, 290])  # 285 ± 12.4: overlaps
    far = Interval.of([170, 172, 174])  # 172 ± 4.97: apart
    assert stats.within_noise(a, near) and stats.within_noise(near, a)
    assert not stats.within_noise(a, far) and not stats.within_noise(far, a)
    # one run measures no noise: never "within noise", whatever the numbers
    assert not stats.within_noise(a, Interval.of([275]))
    # touching bounds count as overlap
    assert stats.within_noise(Interval(1.0, 0.0, 2.0, 3), Interval(3.0, 2.0, 4.0, 3))


def test_ratio_intervals():
    a, b = Interval.of([170, 172, 174]), Interval.of([270, 275, 280])
    r = stats.ratio(a, b)
    assert r.mean == pytest.approx(172 / 275)
    assert (r.low, r.high) == pytest.approx((a.low / b.high, a.high / b.low))
    assert r.n == 3 and r.known and not r.contains(1.0)
    d = stats.ratio(a, b, method="delta")
    assert d.mean == r.mean and d.half_width < r.half_width  # the delta method is narrower
    # hand-computed delta: relative SEs² (2/√3/172)² + (5/√3/275)², Welch df -> 3 (floor)
    va, vb = (2 / 172) ** 2 / 3, (5 / 275) ** 2 / 3
    dof = math.floor((va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2))
    assert d.half_width == pytest.approx(stats.t_quantile(0.95, dof) * r.mean
                                         * math.sqrt(va + vb))
    # the bounds ratio contains 1 exactly when the two intervals overlap
    for x, y in ((a, b), (b, Interval.of([280, 285, 290])), (a, a)):
        assert stats.ratio(x, y).contains(1.0) == stats.within_noise(x, y)
    one = stats.ratio(Interval.of([172]), b)
    assert one.mean == pytest.approx(172 / 275) and not one.known
    assert not stats.ratio(a, Interval.of([-1, 0, 1])).known  # b's interval reaches 0
    assert math.isnan(stats.ratio(a, Interval.of([])).mean)
    with pytest.raises(ValueError):
        stats.ratio(a, b, method="median")


def test_pooled_ratio_is_students_rule_on_the_logs_and_takes_one_value_against_a_spread():
    """stats.pooled_ratio: geometric means' quotient, both sides' spreads of the logs pooled,
    n_a + n_b - 2 degrees of freedom (by hand), so a single new value is judged against
    earlier ones (a prediction interval); one value a side has no spread to judge by."""
    old, new = [100, 102, 98, 101, 99], [90]
    r = stats.pooled_ratio(new, old)
    logs = [math.log(v) for v in old]
    m = sum(logs) / 5
    var = sum((x - m) ** 2 for x in logs) / 4  # the new side's one value adds nothing
    d = math.log(90) - m
    half = stats.t_quantile(0.95, 4) * math.sqrt(var * (1 + 1 / 5))
    assert r.known and r.n == 6 and r.mean == pytest.approx(math.exp(d))
    assert (r.low, r.high) == pytest.approx((math.exp(d - half), math.exp(d + half)))
    assert r.high < 1
    assert not stats.pooled_ratio([90], [100]).known
    assert math.isnan(stats.pooled_ratio([], old).mean)


# --- peak and knee ----------------------------------------------------------------------------
def _curve(label, ys, lats, noise=(1.0,), users=USERS):
    """One load sweep: each repeat is the value times a factor of ``noise`` (mean-preserving
    when the factors average to 1)."""
    return [{"status": "ok", "engine_label": label, "max_concurrency": u, "repeat": i,
             "output_tok_s": y * f, "median_tpot_ms": lat}
            for u, y, lat in zip(users, ys, lats, strict=False) for i, f in enumerate(noise)]


SATURATING = ([10, 20, 40, 75, 110, 130, 128], [10, 10, 10, 11, 15, 25, 50])


def _sat(rows, **kw) -> dict:
    out = stats.saturation(pd.DataFrame(rows), **kw)
    return {r["engine_label"]: r for r in out.to_dict("records")}


def test_saturating_curve_peak_and_knee_are_distinct():
    # per-user rate at 1 user: 10. Steps: 10, 10, 8.75 per added user (kept), then 35/8 =
    # 4.375 from 8 to 16 users: under half of 10 -> the knee is 8 users. Highest: 130 at 32.
    s = _sat(_curve("sat", *SATURATING))["sat"]
    assert (s["peak_x"], s["peak_y"]) == (32, 130) and not s["peak_at_edge"]
    assert (s["knee_x"], s["knee_y"], s["knee_latency"]) == (8, 75, 11)
    assert s["knee_status"] == stats.KNEE_FOUND and "from 8 to 16 users" in s["knee_reason"]
    assert "0.44×" in s["knee_reason"] and s["base_y_per_x"] == 10
    assert s["min_marginal_fraction"] == 0.5 and s["max_latency_multiple"] == 2.0
    assert "50%" in s["rule"] and "2×" in s["rule"] and "median_tpot_ms" in s["rule"]


def test_latency_bar_can_decide_the_knee():
    ys, _ = SATURATING
    s = _sat(_curve("lat", ys, [10, 10, 12, 25, 30, 40, 50]))["lat"]  # 25 > 2 × 10 at 8
    assert s["knee_x"] == 4 and "latency 2.50×" in s["knee_reason"]
    # a looser latency bar moves the knee back to where throughput decides
    assert _sat(_curve("lat", ys, [10, 10, 12, 25, 30, 40, 50]),
                max_latency_multiple=3.0)["lat"]["knee_x"] == 8
    # a stricter throughput bar moves it earlier: 8.75 per user from 4 to 8 is < 90% of 10
    assert _sat(_curve("sat", *SATURATING), min_marginal_fraction=0.9)["sat"]["knee_x"] == 4


def test_linear_curve_has_no_knee_in_range():
    s = _sat(_curve("lin", [10 * u for u in USERS], [10] * 7))["lin"]
    assert s["knee_status"] == stats.KNEE_BEYOND and math.isnan(s["knee_x"])
    assert "beyond the largest load" in s["knee_reason"]
    assert s["peak_x"] == 64 and s["peak_at_edge"]  # the true peak may lie beyond


def test_curve_that_falls_after_its_peak():
    s = _sat(_curve("drop", [10, 20, 40, 70, 100, 90], [10, 10, 11, 12, 14, 30]))["drop"]
    assert (s["peak_x"], s["peak_y"]) == (16, 100) and not s["peak_at_edge"]
    assert s["knee_x"] == 8  # 30 more tok/s over 8 more users: 3.75 per user < 5
    # a curve that peaks and then falls, scaling perfectly up to the peak: peak = knee
    s = _sat(_curve("cliff", [10, 20, 40, 80, 60], [10, 10, 10, 10, 40]))["cliff"]
    assert s["peak_x"] == s["knee_x"] == 8 and "-2.5" in s["knee_reason"]


def test_fig_5_1_shape_peak_at_32_users_is_not_the_knee():
    # the manual's Fig 5.1: output peaked at 275 tok/s at 32 users (no cache reset)
    ys, lats = [25, 49, 95, 170, 240, 275, 262], [20, 20, 21, 24, 34, 58, 115]
    s = _sat(_curve("default", ys, lats))["default"]
    assert (s["peak_x"], s["peak_y"]) == (32, 275)
    assert s["knee_status"] == stats.KNEE_FOUND and s["knee_x"] < s["peak_x"]
    assert s["knee_x"] == 8  # 70 tok/s over 8 users from 8 to 16: 8.75 < 12.5 per user


def test_noisy_repeats_keep_the_answer_and_give_the_peak_an_interval():
    s = _sat(_curve("sat", *SATURATING, noise=(0.97, 1.0, 1.03)))["sat"]
    assert s["peak_x"] == 32 and s["knee_x"] == 8 and s["peak_n"] == 3
    assert s["peak_y"] == pytest.approx(130)
    assert s["peak_low"] < 130 < s["peak_high"]
    assert s["near_peak_x"] == (32.0, 64.0)  # 128 at 64 users is within noise of 130
    # random noise of 1% (seeded) does not move the knee or the peak either
    rng = np.random.default_rng(7)
    rows = _curve("sat", *SATURATING, noise=tuple(1 + rng.normal(0, 0.01, 5)))
    s = _sat(rows)["sat"]
    assert s["peak_x"] in (32, 64) and s["knee_x"] == 8


def test_saturation_edge_cases():
    ys, lats = SATURATING
    rows = _curve("one", [42], [10], users=(4,))  # a single load point
    rows += _curve("gap", [10, float("nan"), 40, 75, 110], lats)  # a NaN mean is skipped
    rows += _curve("nolat", ys, [10, 10, float("nan"), 11, 15, 25, 50])
    rows += [{"status": "failed", "engine_label": "failed", "max_concurrency": 4}]
    rows += [{"status": "ok", "engine_label": "empty", "max_concurrency": 4,
              "output_tok_s": None, "median_tpot_ms": None}]
    s = _sat(rows)
    assert "failed" not in s  # only ok rows count
    assert s["one"]["knee_status"] == stats.KNEE_SINGLE and s["one"]["peak_x"] == 4
    assert s["gap"]["points"] == 4 and s["gap"]["knee_x"] == 8  # 2 users skipped
    assert s["nolat"]["knee_x"] == 8  # the point without latency is left out of the scan
    assert s["empty"]["knee_status"] == stats.KNEE_NO_DATA and math.isnan(s["empty"]["peak_x"])
    # no latency column: only the throughput bar applies, and the reason says so
    no_lat = pd.DataFrame(_curve("sat", *SATURATING)).drop(columns="median_tpot_ms")
    r = stats.saturation(no_lat).iloc[0]
    assert r["knee_x"] == 8 and "latency not checked" in r["knee_reason"]
    assert "median_tpot_ms" not in r["rule"]
    assert stats.saturation(pd.DataFrame(_curve("sat", *SATURATING)), latency=None).iloc[0][
        "knee_x"] == 8
    # ties: the lower load is the peak
    assert _sat(_curve("tie", [10, 20, 20], [1, 1, 1]))["tie"]["peak_x"] == 2
    out = stats.saturation(pd.DataFrame(rows).iloc[0:0].assign(status=pd.Series(dtype=str)))
    assert out.empty and list(out.columns) == ["engine_label", *stats.SATURATION_COLUMNS]
    with pytest.raises(ValueError, match="lacks columns"):
        stats.saturation(pd.DataFrame(rows), curve_by="max_num_seqs")
    with pytest.raises(ValueError):
        stats.saturation(pd.DataFrame(rows), max_latency_multiple=0.5)


def test_request_rate_sweeps_use_their_own_unit():
    rows = [{"status": "ok", "engine_label": "poisson", "request_rate": r, "output_tok_s": y,
             "median_tpot_ms": 10.0} for r, y in ((0.5, 50), (1, 100), (2, 190), (4, 220))]
    s = stats.saturation(pd.DataFrame(rows), x="request_rate").iloc[0]
    assert s["knee_x"] == 2 and "req/s" in s["knee_reason"] and s["peak_x"] == 4


# --- verdicts that respect noise ---------------------------------------------------------------
def test_noise_is_a_verdict_with_a_colour():
    assert NOISE in VERDICTS and NOISE in evidence.VERDICT_ICON
    df = pd.DataFrame([{c: "" for c in claims.COLUMNS} | {"verdict": NOISE, "figure": "3.4"}])
    html = claims.to_html(df)
    assert claims._VERDICT_COLOUR[NOISE] in html and "1 within noise" in html
    assert evidence.noise_verdict(True, False) == HOLDS
    assert evidence.noise_verdict(False, False) == DIFFERS
    assert evidence.noise_verdict(True, True) == NOISE


def test_compare_says_within_noise_when_the_difference_is_smaller_than_the_intervals():
    big, small = Interval.of([790, 798, 806]), Interval.of([566, 574, 582])
    close = Interval.of([780, 795, 810])
    d = evidence.compare(big, small, ">", ("16,384", "2,048"), "ms")
    assert d.verdict == HOLDS and "do not overlap" in d.why and "ms" in d.why
    assert evidence.compare(small, big, ">").verdict == DIFFERS
    assert evidence.compare(small, big, "<").verdict == HOLDS
    d = evidence.compare(big, close, ">")
    assert d.verdict == NOISE and "within noise" in d.why
    # one run: the means decide, and the reason says noise was not measured
    d = evidence.compare(Interval.of([798]), Interval.of([574]), ">")
    assert d.verdict == HOLDS and "noise not measured" in d.why
    assert evidence.compare(big, Interval.of([]), ">").verdict == NOT_MEASURED


def test_compare_for_a_match():
    a, b = Interval.of([100, 102, 104]), Interval.of([101, 103, 105])
    assert evidence.compare(a, b, "=").verdict == HOLDS  # the same within noise
    far = Interval.of([150, 151, 152])
    assert evidence.compare(a, far, "=").verdict == DIFFERS
    wide = Interval.of([80, 130, 180])  # 30% apart in the means, but the repeats cannot tell
    assert evidence.compare(a, wide, "=", tolerance=0.15).verdict == NOISE
    assert evidence.compare(a, wide, "=").verdict == HOLDS
    tight = Interval.of([109.9, 110, 110.1])  # apart, yet 8% off: the same for practice
    assert evidence.compare(a, tight, "=", tolerance=0.15).verdict == HOLDS
    assert evidence.compare(a, tight, "=").verdict == DIFFERS
    one = Interval.of([110])
    assert evidence.compare(a, one, "=").verdict == NOT_MEASURED
    assert evidence.compare(a, one, "=", tolerance=0.15).verdict == HOLDS
    assert evidence.compare(a, Interval.of([150]), "=", tolerance=0.15).verdict == DIFFERS
    with pytest.raises(ValueError):
        evidence.compare(a, b, ">=")


def test_against_reference():
    manual = 172 / 275  # Fig 3.1: capped ÷ default at 32 users
    inside = stats.ratio(Interval.of([170, 172, 174]), Interval.of([270, 275, 280]))
    assert evidence.against_reference(inside, manual).verdict == HOLDS
    outside = Interval.of([0.95, 1.0, 1.05])  # the cap did not bind at all
    assert evidence.against_reference(outside, manual).verdict == DIFFERS
    straddle = Interval.of([0.45, 0.5, 0.55])  # the 1.25× bar (0.5004) runs through it
    d = evidence.against_reference(straddle, manual)
    assert d.verdict == NOISE and "straddles" in d.why
    d = evidence.against_reference(Interval.of([0.6]), manual)
    assert d.verdict == HOLDS and "noise not measured" in d.why
    assert evidence.against_reference(Interval.of([]), manual).verdict == NOT_MEASURED
