"""`specdec ablate`: where each step's time goes, with and without custom kernels.

A matrix over schedulers (autoregressive, eqspec, exspec), kernel backends (torch = no custom kernels, cpp,
triton on CUDA), realignment (shift; mask) and batch sizes, on the same prompts, plus the "paper" row: EQSPEC
realigned the way the reference implementation does it (strip each row's padding and re-pad it, copying every
row of every layer into new tensors in a Python loop), so its share of realignment can be reproduced side by
side. Each run's greedy output is compared with plain greedy decoding (`equivalence`).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time

import torch

import specdec_kernels as sk

from ..decoder import SCHEDULERS, SpeculativeDecoder
from ..drafting.ngram import NgramDrafter
from ..kv.ragged import REALIGN_MODES
from ..models.demo import DRAFT_LAYERS, build_default_pair
from ..models.hf import load_causal_lm
from .check import greedy_reference
from .loading import early_exit_drafter, folder_name, load_draft
from .prompts import encode, load_prompts
from .report import PHASES, format_runs, run_summary

EMBEDDED = "embedded 8-layer Llama target + 2-layer layer-skip draft (specdec/models/demo.py)"


def plan(quick: bool, device: str) -> tuple[list[int], list[dict]]:
    """Batch sizes and the runs at each: dicts of scheduler, backend, realign."""
    batch_sizes = [1, 8] if quick else [1, 2, 4, 8, 16]
    kernels = ["torch"] + [b for b in ("cpp", "triton") if sk.unavailable_reason(b, torch.device(device)) is None
                           and not (b == "triton" and device == "cpu")]
    runs = [dict(scheduler="autoregressive", backend=kernels[-1], realign="shift")]
    for scheduler in ("eqspec", "exspec"):
        for backend in kernels:
            for realign in ("shift", "mask"):
                runs.append(dict(scheduler=scheduler, backend=backend, realign=realign))
    runs.append(dict(scheduler="eqspec", backend="torch", realign="paper"))
    return batch_sizes, runs


def _supported(run: dict) -> bool:
    """Runs whose scheduler or realignment this engine build lacks are left out (and said so)."""
    return run["scheduler"] in SCHEDULERS and run["realign"] in REALIGN_MODES


def load_pair(device: str, target_dir: str | None = None, draft_dir: str | None = None, drafter: str = "model",
              draft_dtype: str | None = None, prompts: list[str] = (), chat: bool = True,
              exit_layer: int | None = None):
    """(target, draft model or drafter, encoded prompts, description of the models)."""
    if target_dir is None:
        target, draft, tokenizer = build_default_pair()
        target = target.to(device)
        if drafter == "early-exit":
            early, what = early_exit_drafter(target, exit_layer or DRAFT_LAYERS)
            return target, early, [tokenizer.encode(t) for t in prompts], f"embedded 8-layer Llama target + {what}"
        return target, draft.to(device), [tokenizer.encode(t) for t in prompts], EMBEDDED
    target, tokenizer = load_causal_lm(target_dir, device=device)
    draft, what = load_draft(target, tokenizer, draft=draft_dir, drafter=drafter,
                             draft_dtype=draft_dtype or "float16", device=device, exit_layer=exit_layer)
    return target, draft, encode(tokenizer, list(prompts), chat), f"{folder_name(target_dir)} target + {what}"


def run_ablation(quick: bool = False, json_out: str | None = "results/ablation.json", plot: str | None = None,
                 device: str = "cpu", threads: int = 1, prompts: str | None = None,
                 max_new_tokens: int | None = None, k: int = 4, batch_sizes: list[int] | None = None,
                 limit: int | None = None, target_dir: str | None = None, draft_dir: str | None = None,
                 drafter: str = "model", draft_dtype: str | None = None, chat: bool = True,
                 command: str | None = None, exit_layer: int | None = None) -> dict:
    torch.set_num_threads(threads)
    texts = load_prompts(prompts, limit=limit or (8 if quick else 24))
    target, draft, ids, models = load_pair(device, target_dir, draft_dir, drafter, draft_dtype, texts, chat,
                                           exit_layer)
    max_new = max_new_tokens or (32 if quick else 64)
    print(f"specdec ablate: {models}; {len(ids)} prompts, {max_new} new tokens, K={k} every step, "
          f"{threads} thread(s), {device}", flush=True)
    reference = greedy_reference(target, ids, max_new)
    planned_sizes, runs = plan(quick, device)
    batch_sizes = batch_sizes or planned_sizes
    skipped = [r for r in runs if not _supported(r)]
    if skipped:
        print(f"not in this engine build, left out: {skipped}", file=sys.stderr)
    records, rows = [], []
    for batch_size in batch_sizes:
        for run in (r for r in runs if _supported(r)):
            # a drafter object keeps per-sequence state: every run gets a fresh one
            fresh = NgramDrafter(draft.max_n, draft.min_n) if isinstance(draft, NgramDrafter) else draft
            decoder = SpeculativeDecoder(target, None if run["scheduler"] == "autoregressive" else fresh,
                                         num_draft_tokens=k, scheduler=run["scheduler"], backend=run["backend"],
                                         realign=run["realign"], adaptive=False)  # K every step: realignment measured
            start = time.perf_counter()
            result = decoder.generate(ids, max_new_tokens=max_new, batch_size=batch_size)
            stats = result.stats
            equivalence = sum(a == b for a, b in zip(result.sequences, reference)) / len(ids)
            records.append({**run, "batch_size": batch_size, "do_sample": False,
                            "tokens_per_s": stats["tokens_per_s"], "total_seconds": stats["total_seconds"],
                            "phase_seconds": {p: stats["phase_seconds"].get(p, 0.0) for p in PHASES},
                            "acceptance_rate": stats["acceptance_rate"], "equivalence": equivalence,
                            "group_rate": stats.get("group_rate"), "wall_seconds": time.perf_counter() - start,
                            "prefill_seconds": stats.get("prefill_seconds", 0.0),
                            "realign_share_of_overhead": realign_share_of_overhead(stats)})
            name = f"B={batch_size} {run['scheduler']} {run['backend']} {run['realign']}"
            rows.append(run_summary(name, stats, threads, exact=equivalence))
            print(format_runs(rows[-1:]).splitlines()[-1], flush=True)
    report = {"runs": records, "machine": machine(threads, device), "command": command, "config": {
        "prompts": len(ids), "max_new_tokens": max_new, "num_draft_tokens": k, "quick": quick, "models": models,
        "target": str(target_dir) if target_dir else None,
        "drafter": "n-gram" if isinstance(draft, NgramDrafter) else "model"}}
    print("\n" + format_runs(rows))
    if json_out:
        os.makedirs(os.path.dirname(json_out) or ".", exist_ok=True)
        with open(json_out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {json_out}")
    if plot:
        plot_ablation(report, plot)
        print(f"wrote {plot}")
    return report


def realign_share_of_overhead(stats: dict) -> float:
    """The paper's measure: realignment over the engine's own overhead, i.e. everything but model forwards
    (draft and verify phases, and the prefill forwards inside scheduling)."""
    p = stats["phase_seconds"]
    overhead = stats["total_seconds"] - p["draft"] - p["verify"] - stats.get("prefill_seconds", 0.0)
    return p["realign"] / overhead if overhead > 0 else 0.0


def machine(threads: int, device: str) -> dict:
    return {"python": sys.version.split()[0], "torch": torch.__version__, "threads": threads, "device": device,
            "cpu_count": os.cpu_count(), "platform": platform.platform(), "backends": list(sk.available_backends()),
            "gpu": torch.cuda.get_device_name() if device.startswith("cuda") else None}


def plot_ablation(report: dict, path: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    runs = report["runs"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(15, 6), gridspec_kw={"width_ratios": [3, 2]})
    biggest = max(r["batch_size"] for r in runs)
    shown = [r for r in runs if r["batch_size"] == biggest]
    labels = [f"{r['scheduler']}\n{r['backend']}/{r['realign']}" for r in shown]
    bottom = [0.0] * len(shown)
    # "schedule" is split into the prefill forwards of new prompts and the scheduling itself
    parts = [(p, (lambda r, p=p: r["phase_seconds"][p])) for p in PHASES if p != "schedule"]
    parts.insert(4, ("schedule: prefill", lambda r: r.get("prefill_seconds", 0.0)))
    parts.insert(5, ("schedule: rest", lambda r: r["phase_seconds"]["schedule"] - r.get("prefill_seconds", 0.0)))
    for label, seconds in parts:
        share = [seconds(r) / max(sum(r["phase_seconds"].values()), 1e-12) for r in shown]
        left.bar(range(len(shown)), share, bottom=bottom, label=label)
        bottom = [b + s for b, s in zip(bottom, share)]
    left.set_xticks(range(len(shown)), labels, fontsize=7)
    left.set_ylabel("share of wall time")
    left.set_title(f"where the time goes, batch {biggest}")
    left.legend(fontsize=8)
    series: dict[str, list] = {}
    for r in runs:
        series.setdefault(f"{r['scheduler']} {r['backend']}/{r['realign']}", []).append(
            (r["batch_size"], r["tokens_per_s"]))
    for name, points in series.items():
        points.sort()
        right.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=name)
    right.set_xscale("log", base=2)
    right.set_xlabel("batch size")
    right.set_ylabel("tokens/s")
    right.set_title("throughput")
    right.legend(fontsize=7)
    models = report.get("config", {}).get("models", EMBEDDED)
    fig.suptitle(f"specdec ablation: {models} ({report['machine']['threads']} thread(s), "
                 f"{report['machine']['device']})")
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
