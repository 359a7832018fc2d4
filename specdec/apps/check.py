"""--check: compare speculative output with plain greedy decoding of each prompt alone, and explain differences.

A difference at a position where the target's top two logits nearly tie is float rounding (a batch of
different shape sums in another order); a difference where the gap is wide is a bug. The reference decodes one
prompt at a time (minutes for a few dozen prompts on a CPU), so it shows a progress bar on a terminal.
"""

from __future__ import annotations

import torch

from .progress import Progress


def _top2_gap(logits: torch.Tensor) -> float:
    top = logits.float().topk(2).values
    return float(top[0] - top[1])


@torch.no_grad()
def plain_greedy(target, prompt: list[int], max_new_tokens: int):
    """target.generate on one prompt alone: (new tokens, per-step logits)."""
    device = next(target.parameters()).device
    ids = torch.tensor([prompt], device=device)
    out = target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens,
                          output_logits=True, return_dict_in_generate=True,
                          pad_token_id=target.generation_config.pad_token_id or 0)
    return out.sequences[0, len(prompt):].tolist(), [step[0] for step in out.logits]


def greedy_reference(target, prompts: list[list[int]], max_new_tokens: int,
                     desc: str = "plain greedy reference") -> list[list[int]]:
    """plain_greedy's tokens for every prompt, with a progress bar."""
    with Progress(len(prompts), desc) as bar:
        out = []
        for index, prompt in enumerate(prompts):
            out.append(plain_greedy(target, prompt, max_new_tokens)[0])
            bar(index)
    return out


@torch.no_grad()
def check_against_greedy(target, prompts: list[list[int]], sequences: list[list[int]], max_new_tokens: int,
                         eos=None, desc: str = "--check: plain greedy reference") -> list[dict]:
    """Per prompt: exact or not; where not, the first differing position and the top-2 logit gaps there."""
    with Progress(len(prompts), desc) as bar:
        return [_check_one(target, index, prompt, got, max_new_tokens, bar)
                for index, (prompt, got) in enumerate(zip(prompts, sequences))]


def _check_one(target, index: int, prompt: list[int], got: list[int], max_new_tokens: int, bar) -> dict:
    want, logits = plain_greedy(target, prompt, max_new_tokens)
    record = compare(target, index, prompt, got, want, logits)
    bar(index)
    return record


@torch.no_grad()
def compare(target, index: int, prompt: list[int], got: list[int], want: list[int], logits=None) -> dict:
    """{prompt, exact} for one output against its plain-greedy reference `want`; where they differ, the first
    differing position and the target's top-2 logit gaps there, after the reference's prefix (from `logits`,
    the reference's per-step logits, when given) and after the speculative output's own prefix."""
    record = {"prompt": index, "exact": got == want}
    if record["exact"]:
        return record
    device = next(target.parameters()).device
    pos = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    if logits is not None:
        gap_plain = _top2_gap(logits[pos]) if pos < len(logits) else float("nan")
    else:
        gap_plain = _top2_gap(target(torch.tensor([prompt + want[:pos]], device=device)).logits[0, -1])
    prefix = torch.tensor([prompt + got[:pos]], device=device)
    record.update(position=pos, spec_token=got[pos] if pos < len(got) else None,
                  plain_token=want[pos] if pos < len(want) else None, gap_plain=gap_plain,
                  gap_spec=_top2_gap(target(prefix).logits[0, -1]))
    return record
