"""From `model.generate(..., assistant_model=draft)` at batch 1 to `specdec.generate` at batch 8: same call, same
tensor.

    python examples/generate_batch.py                   SmolLM2-135M-Instruct and its float16 copy (`make real-demo`
                                                        installs the model)
    python examples/generate_batch.py --target DIR      any local Hugging Face causal LM folder

A transformers user decodes one prompt at a time: transformers refuses assisted generation at batch size > 1. The
same arguments, a tokenizer's padded batch, go to `specdec.generate`. Every returned row must be the row of
model.generate's layout: its left-padded prompt as given, exactly the tokens `model.generate` gives for that
prompt alone, then pad_token_id to the batch's width. Exit status 1 if any row differs. It also reports whether
the tensor equals transformers' batched plain `model.generate` on the padded batch, which can itself differ
from per-prompt decoding by float rounding.
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

import specdec
from specdec.models.hf import cheap_copy, prepare_smollm2

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Translate to German: The weather is nice today.",
    "List three primary colours:",
    "Once upon a time, in a small village,",
    "The derivative of x squared is",
    "Summarise: Speculative decoding drafts tokens cheaply and verifies them in one pass.",
    "Q: What is 12 times 12? A:",
]


def new_tokens(row: torch.Tensor, start: int, eos: set[int]) -> list[int]:
    """A row's new tokens up to and including its first EOS (what a batch-1 generate returns unpadded)."""
    out = []
    for t in row[start:].tolist():
        out.append(t)
        if t in eos:
            break
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", help="local Hugging Face folder (default: SmolLM2-135M-Instruct, converted once)")
    p.add_argument("--prompt", action="append", help="a prompt (repeatable; default: eight built-in ones)")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    folder = args.target or str(prepare_smollm2())
    prompts = args.prompt or PROMPTS

    tokenizer = AutoTokenizer.from_pretrained(folder)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    draft = cheap_copy(model, torch.float16)  # stands in for a smaller model of the same family
    options = dict(do_sample=False, max_new_tokens=args.max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])

    # The user's script at batch 1: one prompt at a time, transformers' assisted generation.
    alone = []
    with torch.no_grad():
        for text in prompts:
            batch = tokenizer([text], return_tensors="pt")
            out = model.generate(**batch, assistant_model=draft, **options)
            alone.append(new_tokens(out[0], batch["input_ids"].shape[1], eos))

    # The same call on the whole padded batch, through specdec.
    batch = tokenizer(prompts, return_tensors="pt", padding=True)
    out = specdec.generate(model, **batch, assistant_model=draft, **options)
    with torch.no_grad():
        batched_plain = model.generate(**batch, **options)

    width = batch["input_ids"].shape[1]
    pad = tokenizer.pad_token_id
    # each row: the prompt as given, that prompt's tokens decoded alone, then pad_token_id to the batch's width
    same_rows = [out[i, :width].tolist() == batch["input_ids"][i].tolist()
                 and out[i, width:].tolist() == alone[i] + [pad] * (out.shape[1] - width - len(alone[i]))
                 for i in range(len(prompts))]
    same_tensor = out.shape == batched_plain.shape and torch.equal(out, batched_plain)
    print(f"{len(prompts)} prompts, batch {len(prompts)}, {args.max_new_tokens} new tokens, "
          f"{torch.get_num_threads()} thread(s)")
    for text, ok, row in zip(prompts, same_rows, alone):
        print(f"  {'same' if ok else 'DIFFERS':7s} {text[:48]!r:52s} -> {tokenizer.decode(row)[:40]!r}")
    print(f"rows equal to model.generate(prompt alone, assistant_model=draft): {sum(same_rows)}/{len(prompts)}")
    print(f"tensor equal to model.generate(**batch) (batched plain greedy): {'yes' if same_tensor else 'no'}")
    # the per-row check is the contract; batched plain decoding is shown, not required (float rounding)
    return 0 if all(same_rows) else 1


if __name__ == "__main__":
    sys.exit(main())
