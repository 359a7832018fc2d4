"""--check: compare speculative output with plain greedy decoding of each prompt alone, and explain differences.

A difference at a position where the target's top two logits nearly tie is float rounding (a batch of
different shape sums in another order); a difference where the gap is wide is a bug.
"""

from __future__ import annotations

import torch


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


@torch.no_grad()
def check_against_greedy(target, prompts: list[list[int]], sequences: list[list[int]], max_new_tokens: int,
                         eos=None) -> list[dict]:
    """Per prompt: exact or not; where not, the first differing position and the top-2 logit gaps there."""
    device = next(target.parameters()).device
    checks = []
    for index, (prompt, got) in enumerate(zip(prompts, sequences)):
        want, logits = plain_greedy(target, prompt, max_new_tokens)
        record = {"prompt": index, "exact": got == want}
        if not record["exact"]:
            pos = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
            prefix = torch.tensor([prompt + got[:pos]], device=device)
            record.update(position=pos, spec_token=got[pos] if pos < len(got) else None,
                          plain_token=want[pos] if pos < len(want) else None,
                          gap_plain=_top2_gap(logits[pos]) if pos < len(logits) else float("nan"),
                          gap_spec=_top2_gap(target(prefix).logits[0, -1]))
        checks.append(record)
    return checks
