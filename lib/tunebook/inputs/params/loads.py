"""What `load:` may say: the keys every load shares (its family's own: tunebook.inputs.datasets),
goodput bounds, and whether a plan sends more prompts than it may."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from tunebook.core import knobs
from tunebook.core.knobs import short
from tunebook.core.sections import type_name
from tunebook.inputs import datasets
from tunebook.inputs.load import DATASETS
from tunebook.inputs.params.model import (
    GOODPUT_KEYS,
    LOAD_KEYS,
    LoadParams,
)
from tunebook.inputs.params.validator import (
    Validator,
)


def read_load(v: Validator, raw: Any) -> LoadParams | None:
    if not isinstance(raw, dict):
        return None
    n0 = len(v.problems)
    v.unknown(raw, LOAD_KEYS, "load")
    d = LoadParams()
    dataset = v.get(raw, "dataset", str, default=d.dataset, prefix="load")
    if isinstance(dataset, str) and dataset not in DATASETS:
        v.err("load.dataset", f"must be one of {DATASETS}, got {short(dataset)}")
    # a load defaults to a small concurrency sweep, a family to its own (the probe: one user)
    family = datasets.family_of(dataset)
    default_users = family.default_users if family and family.default_users else d.users
    users = read_int_list(v, raw.get("users", list(default_users)), "load.users")
    rates_raw = raw.get("request_rates", [None])
    rates: list[float | None] = []
    if not isinstance(rates_raw, list) or not rates_raw:
        v.err("load.request_rates", "must be a non-empty list of requests/s (null = all at "
                                    f"once), got {short(rates_raw)}")
    else:
        for i, r in enumerate(rates_raw):
            if r is None or r == "inf":
                rates.append(None)
            elif isinstance(r, bool) or not isinstance(r, int | float) or not r > 0 \
                    or math.isinf(r) or math.isnan(r):
                v.err(f"load.request_rates[{i}]", "must be a positive number of requests/s or "
                                                  f"null (all at once), got {short(r)}")
            else:
                rates.append(float(r))
    if len(set(rates)) != len(rates):
        v.err("load.request_rates", "has duplicates: each rate runs once per repeat")
    prefix_lens = read_prefix_lens(v, raw.get("prefix_len", 0))
    lp = dict(
        input_len=v.number(raw, "input_len", int, d.input_len, lo=1, prefix="load"),
        output_len=v.number(raw, "output_len", int, d.output_len, lo=1, prefix="load"),
        num_prefixes=v.number(raw, "num_prefixes", int, d.num_prefixes, lo=1, prefix="load"),
        prompts_per_user=v.number(raw, "prompts_per_user", int, d.prompts_per_user, lo=1,
                                  prefix="load"),
        min_prompts=v.number(raw, "min_prompts", int, d.min_prompts, lo=1, prefix="load"),
        num_prompts=v.number(raw, "num_prompts", int, None, lo=1, prefix="load"),
        num_warmups=v.number(raw, "num_warmups", int, d.num_warmups, lo=0, prefix="load"),
        reset_prefix_cache=v.get(raw, "reset_prefix_cache", bool, default=d.reset_prefix_cache,
                                 prefix="load"),
        seed=v.number(raw, "seed", int, None, lo=0, prefix="load"),
        ignore_eos=v.get(raw, "ignore_eos", bool, default=d.ignore_eos, prefix="load"),
    )
    extra = datasets.Extra()
    if family is not None:
        extra = family.check(v, datasets.Draft(dataset, raw, users, rates, prefix_lens, lp))
        for other in datasets.FAMILIES:
            set_here = [k for k in other.own_keys if raw.get(k) is not None]
            if other is not family and set_here:
                v.err(f"load.{set_here[0]}", other.own_hint)
    goodput = read_goodput(v, raw.get("goodput"))
    if len(v.problems) > n0:
        return LoadParams() if not users else LoadParams(users=tuple(users))
    return LoadParams(dataset=dataset, users=tuple(users), request_rates=tuple(rates),
                      prefix_len=tuple(prefix_lens), replay=extra.replay, speeds=extra.speeds,
                      goodput=goodput, **lp)


def read_goodput(v: Validator, raw: Any) -> dict[str, float]:
    """`goodput: {ttft_ms: 2000, tpot_ms: 100, e2el_ms: 20000}`: per-request bounds; a request
    is good when it meets every one (vLLM's --goodput)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        v.err("load.goodput", "must map ttft_ms / tpot_ms / e2el_ms to milliseconds, e.g. "
                              f"{{ttft_ms: 2000, tpot_ms: 100}}, got {short(raw)}")
        return {}
    out = {}
    for k, x in raw.items():
        if k not in GOODPUT_KEYS:
            v.err(f"load.goodput.{k}", f"unknown bound{knobs.did_you_mean(str(k), GOODPUT_KEYS)}"
                                       f"; allowed: {', '.join(GOODPUT_KEYS)}")
        elif isinstance(x, bool) or not isinstance(x, int | float) or not x > 0 \
                or not math.isfinite(x):
            v.err(f"load.goodput.{k}", f"must be milliseconds > 0, got {short(x)}")
        else:
            out[k] = float(x)
    return out


def read_prefix_lens(v: Validator, raw: Any) -> list[int]:
    """`prefix_len`: one number of tokens (>= 0), or a non-empty list of them (one load point
    each)."""
    values = raw if isinstance(raw, list) else [raw]
    if isinstance(raw, list) and not raw:
        v.err("load.prefix_len", "must be a number of tokens >= 0 or a non-empty list of them, "
                                 "got []")
        return []
    out = []
    for i, x in enumerate(values):
        key = f"load.prefix_len[{i}]" if isinstance(raw, list) else "load.prefix_len"
        if isinstance(x, bool) or not isinstance(x, int) or x < 0:
            v.err(key, f"must be an integer >= 0 (tokens), got {type_name(x)} {short(x)}")
        else:
            out.append(x)
    if len(set(out)) != len(out):
        dups = sorted({x for x in out if out.count(x) > 1})
        v.err("load.prefix_len", f"has duplicates ({short(dups)}): list each value once")
    return out  # empty only when every entry was wrong (and said so)


def read_int_list(v: Validator, raw: Any, key: str) -> list[int]:
    if not isinstance(raw, list) or not raw:
        v.err(key, f"must be a non-empty list of positive integers such as [1, 2, 4, 8], got "
                   f"{type_name(raw)} {short(raw)}")
        return []
    out = []
    for i, x in enumerate(raw):
        if isinstance(x, bool) or not isinstance(x, int) or x <= 0:
            v.err(f"{key}[{i}]", f"must be a positive integer, got {short(x)}")
        else:
            out.append(x)
    if len(set(out)) != len(out):
        dups = sorted({x for x in out if out.count(x) > 1})
        v.err(key, f"has duplicates ({short(dups)}): list each value once")
    return out


def prompts_check(v: Validator, load: LoadParams, n_engines: int, repeats: int,
                   max_prompts: int) -> None:
    """The prompts a plan sends, over every run, warm-ups included, must stay under
    max_prompts. The key named is the one whose default (or smallest sensible value) would
    shrink the total most: the one that blew it up."""
    def total(ld: LoadParams, engines: int = n_engines, reps: int = repeats) -> int:
        return ld.prompts_sent() * engines * reps

    n = total(load)
    if n <= max_prompts:
        return
    d = LoadParams()
    shrunk = {
        "load.users": total(replace(load, users=(1,))),
        "load.num_prompts": total(replace(load, num_prompts=None)),
        "load.prompts_per_user": total(replace(load, prompts_per_user=d.prompts_per_user)),
        "load.min_prompts": total(replace(load, min_prompts=d.min_prompts)),
        "load.num_warmups": total(replace(load, num_warmups=d.num_warmups)),
        "load.request_rates": total(replace(load, request_rates=(None,))),
        "load.prefix_len": total(replace(load, prefix_len=(0,))),
        "engine_grid": total(load, engines=1),
        "repeats": total(load, reps=1),
    }
    key = min(shrunk, key=lambda k: shrunk[k])  # ties: the first listed (users, then counts)
    runs = n_engines * repeats * len(load.users) * len(load.request_rates) * len(load.prefix_len)
    largest = max(load.prompts(u) for u in load.users)
    v.err(key, f"the plan sends {n:,} prompts (num_prompts + num_warmups over {runs:,} run(s); "
               f"the largest run sends {largest:,}), over max_prompts={max_prompts:,}; "
               f"narrow {key} or raise max_prompts deliberately")
