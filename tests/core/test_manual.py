"""The manual's figure index parses, and every number a claim states is encoded as a Ref of
its figure's unit in the registry (tunebook.figures)."""

from __future__ import annotations

import math
import re

import pytest

from tunebook import figures
from tunebook.core import config, manual
from tunebook.core.manual import EDITION, FIGURES, NOT_MEASUREMENTS
from tunebook.figures import reference_frame

UNITS = figures.REGISTRY  # fig -> FigureUnit: the claim (from the seed) and its refs
SEED = config.home().parent / "shared" / "seed" / "figure-index.txt"

# Digits as the claims write them: 24,096 · 0.75 · 7.5
NUMBER = re.compile(r"\d+(?:,\d{3})*(?:\.\d+)?")
# Numbers the claims spell out in words (for the reverse check: every Ref is in its claim).
WORDS = {1: ("one",), 2: ("twice",), 3: ("three",), 4: ("four",), 6: ("six",), 8: ("eight",),
         1 / 3: ("a third",)}


def _claim_numbers(claim: str) -> list[float]:
    for name in sorted(NOT_MEASUREMENTS, key=len, reverse=True):
        claim = claim.replace(name, " ")
    return [float(n.replace(",", "")) for n in NUMBER.findall(claim)]


def _covers(ref: manual.Ref, number: float) -> bool:
    candidates = [ref.value] + ([ref.value * 100] if ref.unit == "x" else [])  # "37 percent"
    return any(math.isclose(c, number, rel_tol=1e-9) for c in candidates)


def test_index_has_every_row():
    index = manual.INDEX_PATH.read_text(encoding="utf-8")
    rows = [ln for ln in index.splitlines() if re.match(r"^\d+\.\d+\s", ln)]
    # The index lists 26 figures (1.1-1.3, 2.1-2.6, 3.1-3.4, 4.1-4.3, 5.1-5.3, 6.1-6.2, 7.1,
    # 8.1-8.4), though the manual is sometimes described as having 28.
    assert len(FIGURES) == len(rows) == 26
    assert list(FIGURES)[:3] == ["1.1", "1.2", "1.3"] and list(FIGURES)[-1] == "8.4"
    assert all(f.claim in index for f in FIGURES.values())
    assert FIGURES["2.4"].chapter == 2


def test_packaged_index_is_the_seed():
    """The package ships a copy of the manual's index; it must be the seed's text."""
    if not SEED.is_file():
        pytest.skip(f"no seed beside this checkout ({SEED.name})")
    assert manual.INDEX_PATH.read_text(encoding="utf-8") == SEED.read_text(encoding="utf-8")


def test_edition():
    assert (EDITION.vllm_version, EDITION.vllm_commit, EDITION.date, EDITION.edition) == (
        "0.31.0", "db9527a", "2026-10-05", "2026.10")


def test_key_numbers():
    f13 = UNITS["1.3"]
    assert f13.ref("output_ratio_64_vs_1").value == 8.0
    assert f13.ref("tpot_ratio_64_vs_1").value == 7.5
    assert {r.value for r in UNITS["2.1"].refs} == {144.0, 96.0}
    assert UNITS["2.1"].ref("kv_kib_per_token_qwen3_30b_a3b").model == "Qwen3-30B-A3B"
    assert UNITS["3.1"].ref("output_tok_s_cap16_32_users").value == 172
    assert UNITS["3.4"].ref("p99_itl_ms_budget_16384").value == 798


@pytest.mark.parametrize("fig", list(UNITS))
def test_every_number_in_the_claim_is_a_ref(fig):
    f = UNITS[fig]
    missed = [n for n in _claim_numbers(f.claim) if not any(_covers(r, n) for r in f.refs)]
    assert not missed, f"Fig {fig}: numbers {missed} in {f.claim!r} have no Ref"


@pytest.mark.parametrize("fig", list(UNITS))
def test_every_ref_is_in_its_claim(fig):
    f = UNITS[fig]
    numbers = _claim_numbers(f.claim)
    for r in f.refs:
        in_digits = any(_covers(r, n) for n in numbers)
        in_words = any(w in f.claim for v, ws in WORDS.items()
                       if math.isclose(v, r.value) for w in ws)
        assert in_digits or in_words, f"Fig {fig}: {r.name}={r.value} is not in the claim"


def test_refs_are_well_formed():
    for f in UNITS.values():
        names = [r.name for r in f.refs]
        assert len(names) == len(set(names)), f.fig
        for r in f.refs:
            assert re.fullmatch(r"[a-z0-9_]+", r.name), r.name
            assert r.kind in (manual.RESULT, manual.SETTING)
            assert r.qualifier in ("=", "≈", ">", "≤")
            assert r.unit and r.meaning and "\n" not in r.meaning


def test_hardware_read_from_each_claim():
    hw = {fig: f.hardware for fig, f in UNITS.items() if f.hardware}
    assert hw == {"1.3": "DGX Spark", "2.4": "DGX Spark", "5.3": "DGX Spark",
                  "3.2": "L4", "4.2": "L4", "4.3": "L4", "5.2": "L4"}
    for fig in ("2.6", "4.1"):  # "with the clock locked", no machine named
        assert UNITS[fig].hardware is None and "clock locked" in UNITS[fig].note
    assert UNITS["3.1"].model == "Qwen3-8B"


def test_figures_without_numbers_have_no_refs():
    for fig in ("1.1", "1.2", "2.3", "3.3", "6.1", "6.2", "7.1"):
        assert UNITS[fig].refs == ()


def test_reference_frame():
    df = reference_frame(["1.3", "2.1"])
    assert list(df.columns[:5]) == ["fig", "ref", "value", "unit", "meaning"]
    assert {"hardware", "model", "source"} <= set(df.columns)
    assert set(df["fig"]) == {"1.3", "2.1"}
    assert df["source"].str.contains("reference, not measured here").all()
    assert df["source"].str.contains("Edition 2026.10").all()
    assert set(df.loc[df.fig == "2.1", "model"]) == {"Qwen3-8B", "Qwen3-30B-A3B"}
    full = reference_frame()
    assert len(full) == sum(len(f.refs) for f in UNITS.values())
    assert reference_frame([]).empty
    with pytest.raises(KeyError, match="9.9"):
        reference_frame(["9.9"])
