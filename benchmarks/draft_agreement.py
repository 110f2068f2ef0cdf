"""How often does each stand-in draft model pick the full SmolLM2's greedy next token?

No second real model shares SmolLM2's tokenizer, so the draft models of the speculation
figures are stand-ins built from the same GGUF (tunebook.models.gguf): the first N of the 30
layers (``smollm2-135m-layers<N>``) and re-quantized copies (``-q8``, ``-q4``). A draft is
worth having when it is (a) much cheaper than the target and (b) agrees with it often. This
measures both on CPU with plain torch (no vLLM), fp32 compute on the presets' fp16 weights:

- agreement: the share of positions where the stand-in's argmax equals the full model's, over
  two texts run teacher-forced: a passage of Python's standard library source (``--module``)
  and the full model's own greedy chat answer to a fixed question. On the latter, a greedy
  draft proposes exactly the tokens scored here, so ``tok/pass@k`` (mean tokens per target
  pass with k drafted tokens: the accepted run plus the target's bonus token) is what greedy
  speculative decoding would get, up to vLLM's fp16 rounding.
- cost: multiply-accumulates per token relative to the target (layers plus the tied 49152 x
  576 head, which every draft pays in full), and torch's measured decode ms per token (one
  stream, KV cache, one thread: two threads beside another busy process slowed decoding 20x
  here; the best of two runs; Python overhead included, so a rough guide).

    PYTHONPATH=lib .venv/bin/python benchmarks/draft_agreement.py [--layers 6 10 15 20 24 28]
        [--module textwrap] [--stdlib-tokens 400] [--answer-tokens 300] [--out FILE.md]

Early exits for every N come from one forward pass of the full model (the final norm and head
applied to layer N's output, exactly what a layers-N preset computes); each built layers preset
is also run on its own and must agree with its early exit (a check of the presets' folders).
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import platform
import sys
import time
from pathlib import Path

import torch

from tunebook.models import gguf as gguf_model
from tunebook.models import presets as models

REPO = Path(__file__).resolve().parents[1]
TARGET = "smollm2-135m"
QUESTION = "Explain how a hash table works, with a short Python example."
DEPTHS = (1, 2, 4, 7)


def load(preset: str):  # -> transformers model, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = models.build_model_dir(preset)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    return model.eval(), AutoTokenizer.from_pretrained(folder)


def layer_macs(cfg: dict) -> int:
    h, inter = cfg["hidden_size"], cfg["intermediate_size"]
    hd = cfg["head_dim"]
    q, kv = cfg["num_attention_heads"] * hd, cfg["num_key_value_heads"] * hd
    return h * q + 2 * h * kv + q * h + 3 * h * inter


def relative_macs(layers: int, cfg: dict) -> float:
    head = cfg["vocab_size"] * cfg["hidden_size"]
    return (layers * layer_macs(cfg) + head) / (cfg["num_hidden_layers"] * layer_macs(cfg) + head)


def tokens_per_pass(agree: list[bool], k: int) -> float:
    """Greedy speculation with k drafted tokens over a target-greedy text: each target pass
    accepts the draft's run of agreements (at most k) and adds one token of its own."""
    i = passes = 0
    while i < len(agree):
        run = 0
        while run < k and i + run < len(agree) and agree[i + run]:
            run += 1
        i += run + 1
        passes += 1
    return len(agree) / passes


@torch.no_grad()
def decode_ms_per_token(model, ids: torch.Tensor, new_tokens: int = 32) -> float:
    model.generate(ids, max_new_tokens=4, do_sample=False)  # warm-up
    best_s = float("inf")
    for _ in range(2):
        t0 = time.perf_counter()
        out = model.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
        best_s = min(best_s, time.perf_counter() - t0)
    assert out.shape[1] == ids.shape[1] + new_tokens
    return best_s * 1000 / new_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, nargs="+", default=list(gguf_model.LAYER_STAND_INS))
    ap.add_argument("--module", default="textwrap", help="stdlib module whose source is read")
    ap.add_argument("--stdlib-tokens", type=int, default=400)
    ap.add_argument("--answer-tokens", type=int, default=300)
    ap.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = ap.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)  # steady timings on a shared machine (see the docstring)
    t_start = time.monotonic()

    target, tok = load(TARGET)
    cfg = models.PRESETS[TARGET]["config"]
    n_layers = cfg["num_hidden_layers"]

    # Text 1: real source code, teacher-forced.
    source = inspect.getsource(importlib.import_module(args.module))
    code_ids = tok(source, return_tensors="pt").input_ids[:, : args.stdlib_tokens + 1]
    # Text 2: the target's own greedy answer (what a draft faces while decoding).
    prompt = tok.apply_chat_template([{"role": "user", "content": QUESTION}],
                                     add_generation_prompt=True, return_tensors="pt",
                                     return_dict=True).input_ids
    with torch.no_grad():
        chat_ids = target.generate(prompt, max_new_tokens=args.answer_tokens, do_sample=False)
    texts = {  # name -> (ids, first scored position: predicts the token after it)
        f"{args.module}.py source": (code_ids, 0),
        "greedy chat answer": (chat_ids, prompt.shape[1] - 1),
    }

    @torch.no_grad()
    def argmaxes(model) -> dict[str, torch.Tensor]:
        return {name: model(ids).logits[0, start:-1].argmax(-1)
                for name, (ids, start) in texts.items()}

    @torch.no_grad()
    def early_exits() -> dict[str, dict[int, torch.Tensor]]:
        out: dict[str, dict[int, torch.Tensor]] = {}
        for name, (ids, start) in texts.items():
            hidden = target(ids, output_hidden_states=True).hidden_states
            # hidden_states[i] is layer i's output for i < n_layers; the last one is normed.
            out[name] = {n: target.lm_head(target.model.norm(hidden[n]))[0, start:-1].argmax(-1)
                         for n in range(1, n_layers)}
        return out

    full = argmaxes(target)
    exits = early_exits()
    target_ms = decode_ms_per_token(target, prompt)

    rows = []  # (stand-in, layers, rel MACs, ms/token, {text: agreement}, tok/pass by depth)

    def row(name: str, layers: int, preds: dict[str, torch.Tensor], ms: float | None) -> None:
        agree = {t: (preds[t] == full[t]).float().mean().item() for t in texts}
        chat_agree = (preds["greedy chat answer"] == full["greedy chat answer"]).tolist()
        tpp = {k: tokens_per_pass(chat_agree, k) for k in DEPTHS}
        rows.append((name, layers, relative_macs(layers, cfg), ms, agree, tpp))

    checked = []
    for n in sorted(set(args.layers)):
        preset = f"{TARGET}-layers{n}"
        ms = None
        if preset in models.PRESETS:  # a built stand-in: its own run must match the early exit
            draft, _ = load(preset)
            own = argmaxes(draft)
            for t in texts:
                same = (own[t] == exits[t][n]).float().mean().item()
                if same < 0.99:
                    sys.exit(f"{preset} agrees with the early exit at {n} layers on only "
                             f"{same:.1%} of {t}: the preset folder is wrong")
            checked.append(preset)
            ms = decode_ms_per_token(draft, prompt)
            del draft
        row(preset if preset in models.PRESETS else f"(early exit at {n} layers)", n,
            {t: exits[t][n] for t in texts}, ms)
    for suffix in gguf_model.REQUANT_STAND_INS:
        preset = f"{TARGET}-{suffix}"
        draft, _ = load(preset)
        row(preset, n_layers, argmaxes(draft), decode_ms_per_token(draft, prompt))
        del draft

    positions = {t: int(ids.shape[1] - 1 - start) for t, (ids, start) in texts.items()}
    cmd = "PYTHONPATH=lib .venv/bin/python benchmarks/draft_agreement.py " + " ".join(
        sys.argv[1:])
    lines = [
        "# Stand-in drafts: agreement with smollm2-135m's greedy next token",
        "",
        f"Command: `{cmd.strip()}` ({time.strftime('%Y-%m-%d')}, Python "
        f"{platform.python_version()}, torch {torch.__version__} on 1 thread, "
        f"{platform.machine()}, "
        f"{time.monotonic() - t_start:.0f} s).",
        "Texts: " + "; ".join(f"{t} ({n} positions)" for t, n in positions.items())
        + f". Chat question: \"{QUESTION}\". Target decode: {target_ms:.1f} ms/token (torch).",
        f"Early exits checked against their preset folders: {', '.join(checked) or 'none'}.",
        "",
        "| stand-in | layers | MACs vs target | torch ms/token | "
        + " | ".join(f"agree: {t}" for t in texts) + " | "
        + " | ".join(f"tok/pass@{k}" for k in DEPTHS) + " |",
        "|---|---:|---:|---:|" + "---:|" * (len(texts) + len(DEPTHS)),
    ]
    for name, layers, macs, ms, agree, tpp in rows:
        lines.append(
            f"| {name} | {layers} | {macs:.2f} | {'' if ms is None else f'{ms:.1f}'} | "
            + " | ".join(f"{agree[t]:.1%}" for t in texts) + " | "
            + " | ".join(f"{tpp[k]:.2f}" for k in DEPTHS) + " |")
    curve = ", ".join(
        f"{n}: {(exits['greedy chat answer'][n] == full['greedy chat answer']).float().mean():.0%}"
        for n in range(1, n_layers))
    lines += ["", f"Early-exit agreement on the chat answer for every N: {curve}.",
              "tok/pass@k: mean tokens per target pass with k drafted tokens on the chat answer "
              "(1.00 = no gain; k + 1 = every draft accepted)."]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
