"""Speed side by side: plain batched decoding against speculative decoding with each drafter, with the speculation
controller (adaptive) and with a fixed K, per prompt category and batch size, and optionally what a transformers
user would run instead. Every configuration of a (category, batch size) cell runs in the same process, `repeats`
times, in a shuffled order (seeded, a new one every repeat), so the noise of a shared machine falls on all of
them alike; the ratios are what to read, not the absolute rates. Not a rotation: a run is slowed or sped up by
the one before it (its heap and caches), and a rotation keeps every run's predecessor. Measured on the demo pair
(math, batch 8, 12 repeats, rotated): three identical plain decoders came out 1.000x, 1.047x and 1.016x.

A speed-up is the median over repeats of the ratio within each repeat (plain's seconds in that repeat over the
run's), not the ratio of totals. The speed of this machine drifts by ±25% over seconds (the CPU time of one
identical run of the demo pair: 324 to 551 ms in 8 repeats, `bench/plain_gap.py`), so totals follow whichever
configurations happened to meet a slow spell; a repeat's runs are seconds apart and share it, and a median
ignores the repeat that caught a change of pace. Rows keep both (speedup_of_totals). With `block`, a repeat
goes further: it runs the cell a block of prompts at a time, every configuration on a block before the next, so
the runs being compared are seconds apart, not a whole repeat.

Decoders live as long as their cell: the controller learns costs and acceptance on the first repeat and keeps them
(as it would across a user's generate calls); the first repeat's exploration is part of the measured time.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import sys
import time
from typing import Callable

import torch

from ..decoder import SpeculativeDecoder
from .report import merge_stats

Factory = Callable[[], object]  # makes a drafter (a model or a drafter object)
NOISE_GAUGE = "plain again (noise gauge)"


def trim_after_eos(tokens: list[int], eos: set[int]) -> list[int]:
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[:i + 1]
    return tokens


def eos_and_pad(target) -> tuple[set[int], int]:
    """The target's EOS ids and the pad id transformers' generate gets (its own, else the smallest EOS id)."""
    eos = getattr(target.generation_config, "eos_token_id", None)
    eos = set([eos] if isinstance(eos, int) else (eos or []))
    pad = target.generation_config.pad_token_id
    return eos, pad if isinstance(pad, int) else (min(eos) if eos else 0)


class EngineRun:
    def __init__(self, target, drafter, adaptive: bool, k: int, scheduler: str):
        if drafter is None:
            self.decoder = SpeculativeDecoder(target, None, scheduler="autoregressive")
        else:
            self.decoder = SpeculativeDecoder(target, drafter, num_draft_tokens=k, scheduler=scheduler,
                                              adaptive=adaptive)
        self.stats: list[dict] = []

    def run(self, ids, max_new: int, batch_size: int):
        res = self.decoder.generate(ids, max_new_tokens=max_new, batch_size=batch_size)
        self.stats.append(res.stats)
        return res.sequences


class TransformersRun:
    """model.generate as a transformers user calls it: per prompt (batch 1) with prompt lookup or an assistant
    model (assisted generation refuses batches), or plain over left-padded batches."""

    def __init__(self, target, how: str, assistant=None, pad_id: int = 0):
        self.target, self.how, self.assistant, self.pad_id = target, how, assistant, pad_id
        self.stats: list[dict] = []

    def run(self, ids, max_new: int, batch_size: int, k: int = 4):
        out = []
        with torch.no_grad():
            if self.how == "batched":
                for i in range(0, len(ids), batch_size):
                    chunk = ids[i:i + batch_size]
                    width = max(map(len, chunk))
                    x = torch.full((len(chunk), width), self.pad_id, dtype=torch.int64)
                    mask = torch.zeros_like(x)
                    for b, p in enumerate(chunk):
                        x[b, width - len(p):] = torch.tensor(p)
                        mask[b, width - len(p):] = 1
                    y = self.target.generate(x, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                                             pad_token_id=self.pad_id)
                    out += [row[width:].tolist() for row in y]
            else:
                extra = {"prompt_lookup_num_tokens": k} if self.how == "lookup" else {}
                if self.how == "assisted":
                    extra = {"assistant_model": self.assistant}
                for p in ids:
                    x = torch.tensor([p])
                    y = self.target.generate(x, attention_mask=torch.ones_like(x), do_sample=False,
                                             max_new_tokens=max_new, pad_token_id=self.pad_id, **extra)
                    out.append(y[0, len(p):].tolist())
        return out


def measure(target, drafters: dict[str, Factory], categories: dict, batch_sizes, *, max_new: int = 64, k: int = 4,
            repeats: int = 2, scheduler: str = "eqspec", fixed: bool = True, transformers: bool = False,
            assistants: dict | None = None, show=print, sequences: dict | None = None,
            clock: str = "wall", min_seconds: float = 0.0, max_repeats: int | None = None,
            noise_gauge: bool = False, block: int | None = None, copies: int = 1) -> list[dict]:
    """Rows {category, batch_size, run, seconds, tokens_per_s, speedup, ...}; categories: {name: [token ids]}.

    clock: what `seconds` and `speedup` count: "wall" time, or the process's "cpu" time (with one torch thread,
    the work done, whatever else the machine runs; both are in every row).

    drafters: name -> factory of a drafter; each runs adaptive (and with fixed K when `fixed`). transformers:
    add transformers' own generate at batch 1 (plain, prompt lookup, and assisted with each of `assistants`)
    and plain batched generate at every batch size above 1. sequences: a dict to receive every run's last
    sequences (trimmed after EOS), keyed (category, batch_size, run), for checks against a reference.

    min_seconds: a cell repeats past `repeats` until plain decoding has run this long in all (on `clock`), up to
    `max_repeats` (default 8 x repeats): a short cell's ratios are the noisiest (a run of a few hundred ms
    meets one spell of the machine or another), and its extra repeats are cheap.

    noise_gauge: add NOISE_GAUGE, a second plain decoder measured like every other run: its speed-up over plain
    is 1 by construction, so what it reads is the cell's noise, the yardstick for every other row of the cell.

    block: prompts per block (None: the whole cell). A repeat runs the cell block by block, every configuration on
    a block (in a shuffled order) before the next block, and a configuration's time in the repeat is the sum over
    blocks. Two runs of a block are then a few seconds apart rather than a whole repeat: the machine's pace
    drifts over tens of seconds, so their ratio carries less of it (one demo prompt decoded 120 times in a row:
    the ratio of adjacent runs varies by 5.6%, of runs 14 apart by 10.5%). 0 means one batch of prompts
    (`batch_size`) per block: no row refills from the next block, so at a batch size that does not divide the
    cell the last block runs smaller (as an EQSPEC batch whose rows all finish together would).

    copies: decoders per adaptive configuration, each with a controller of its own, each run once a block. A
    controller learns along its path (one early noisy sample can keep it plain for a call), so one decoder's
    time is one path's: two copies of one controller have read 4% apart on the demo pair. The row's time per
    repeat is the copies' mean; "copy_seconds" and "copy_speedups" keep each copy's, and its stats are every
    copy's last repeat merged (counts such as steps add up over the copies; widths and shares are theirs)."""
    if clock not in ("wall", "cpu"):
        raise ValueError(f"clock must be 'wall' or 'cpu', got {clock!r}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if not min_seconds >= 0:
        raise ValueError(f"min_seconds must be >= 0, got {min_seconds}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be an int >= 1, got {copies!r}")
    if block is not None and (isinstance(block, bool) or not isinstance(block, int) or block < 0):
        raise ValueError(f"block must be None or an int >= 0 (prompts per block; 0: one batch), got {block!r}")
    max_repeats = 8 * repeats if max_repeats is None else max_repeats
    if max_repeats < repeats:
        raise ValueError(f"max_repeats must be >= repeats ({repeats}), got {max_repeats}")
    eos, pad = eos_and_pad(target)
    rows = []
    for category, ids in categories.items():
        for batch_size in batch_sizes:
            runs: dict[str, object] = {"plain": EngineRun(target, None, True, k, scheduler)}
            if noise_gauge:
                runs[NOISE_GAUGE] = EngineRun(target, None, True, k, scheduler)
            members: dict[str, list[str]] = {}  # a row's runs: its adaptive copies, else the run alone
            for name, make in drafters.items():
                row_name = f"{name}, adaptive"
                members[row_name] = [row_name] + [f"{row_name} #{c + 1}" for c in range(1, copies)]
                for run_name in members[row_name]:
                    runs[run_name] = EngineRun(target, make(), True, k, scheduler)
                if fixed:
                    runs[f"{name}, fixed K={k}"] = EngineRun(target, make(), False, k, scheduler)
            if transformers and batch_size == 1:
                runs["transformers generate"] = TransformersRun(target, "plain", pad_id=pad)
                runs[f"transformers prompt lookup K={k}"] = TransformersRun(target, "lookup", pad_id=pad)
                for name, model in (assistants or {}).items():
                    runs[f"transformers assisted ({name})"] = TransformersRun(target, "assisted", model, pad)
            elif transformers:
                runs["transformers batched generate"] = TransformersRun(target, "batched", pad_id=pad)
            names = list(runs)
            wall, cpu = {n: [] for n in names}, {n: [] for n in names}
            outputs: dict[str, list] = {}
            shuffle = random.Random(len(rows))
            timed = cpu if clock == "cpu" else wall
            size = len(ids) if block is None else (block or batch_size)
            blocks = [ids[i:i + size] for i in range(0, len(ids), max(1, size))] or [ids]
            rep = 0
            while rep < repeats or (sum(timed["plain"]) < min_seconds and rep < max_repeats):
                rep += 1
                for name in names:
                    wall[name].append(0.0)
                    cpu[name].append(0.0)
                    outputs[name] = []
                for part in blocks:
                    for name in shuffle.sample(names, len(names)):
                        w, c = time.perf_counter(), time.process_time()
                        seqs = runs[name].run(part, max_new, batch_size)
                        wall[name][-1] += time.perf_counter() - w
                        cpu[name][-1] += time.process_time() - c
                        outputs[name] += [trim_after_eos(list(q), eos) for q in seqs]
            seconds = timed
            if sequences is not None:
                sequences.update({(category, batch_size, name): seqs for name, seqs in outputs.items()})
            tokens = sum(len(q) for q in outputs["plain"]) * rep
            copied = {m for group in members.values() for m in group[1:]}
            for name in (n for n in names if n not in copied):
                group = members.get(name, [name])
                own = {label: [statistics.mean(t) for t in zip(*(times[m] for m in group))]
                       for label, times in (("wall", wall), ("cpu", cpu))}
                mine = own["cpu"] if clock == "cpu" else own["wall"]
                stats = [st for m in group for st in getattr(runs[m], "stats", [])]
                last = merge_stats([last_repeat(getattr(runs[m], "stats", []), len(blocks)) for m in group])
                total = sum(mine)
                row = {"category": category, "batch_size": batch_size, "run": name, "seconds": total,
                       "clock": clock, "wall_seconds": sum(own["wall"]), "cpu_seconds": sum(own["cpu"]),
                       "repeats": rep, "repeat_seconds": list(mine),
                       "wall_speedup": paired_speedup(wall["plain"], own["wall"]),
                       "cpu_speedup": paired_speedup(cpu["plain"], own["cpu"]),
                       "tokens_per_s": tokens / total if total else 0.0,
                       "speedup": paired_speedup(seconds["plain"], mine),
                       "speedup_of_totals": sum(seconds["plain"]) / total if total else 0.0,
                       "copy_seconds": [list(seconds[m]) for m in group],
                       "copy_speedups": [paired_speedup(seconds["plain"], seconds[m]) for m in group],
                       "exact": all(outputs[m] == outputs["plain"] for m in group),
                       "acceptance_rate": last.get("acceptance_rate"), "mean_width": last.get("mean_width"),
                       "plain_steps": last.get("plain_steps"), "steps": last.get("steps"),
                       "explore_steps": last.get("explore_steps"),
                       "control_share": (sum(st.get("control_seconds", 0.0) for st in stats)
                                         / max(1e-12, sum(st.get("total_seconds", 0.0) for st in stats)))
                       if stats else None,
                       # a draft model's prefill of new prompts (the prompt part of its catch-ups)
                       "draft_prefill_share": (sum(st.get("draft_prefill_seconds", 0.0) for st in stats)
                                               / max(1e-12, sum(st.get("total_seconds", 0.0) for st in stats)))
                       if stats else None,
                       "width_histogram": last.get("width_histogram"),
                       "acceptance_table": last.get("acceptance_table")}
                rows.append(row)
                show(format_row(row))
    return rows


def last_repeat(stats: list[dict], calls: int) -> dict:
    """The stats of a run's last repeat: its last `calls` generate calls (one per block) merged, with the
    acceptance table as the last call left it."""
    if not stats:
        return {}
    parts = stats[-calls:]
    out = merge_stats(parts)
    if "acceptance_table" in parts[-1]:
        out["acceptance_table"] = parts[-1]["acceptance_table"]
    return out


def report(title: str, text: str, path: str | None, header: str, rows: list[dict]) -> None:
    """A bench script's ending: print the table under its title, and write {header, command, rows} to `path`."""
    print(f"\n{title}\n")
    print(text)
    if path:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump({"header": header, "command": " ".join(sys.argv), "rows": rows}, f, indent=1)


def paired_speedup(base: list[float], run: list[float]) -> float:
    """The median over repeats of base[r] / run[r] (0.0 where a run took no time)."""
    ratios = [b / r if r > 0 else 0.0 for b, r in zip(base, run)]
    return statistics.median(ratios) if ratios else 0.0


def format_row(row: dict) -> str:
    width = f"{row['mean_width']:.2f}" if row.get("mean_width") else "-"
    acc = f"{row['acceptance_rate']:.0%}" if row.get("acceptance_rate") else "-"
    return (f"{str(row['category']):15s} B={row['batch_size']:<2d} {row['run']:34s} {row['speedup']:5.2f}x "
            f"{row['tokens_per_s']:7.1f} tok/s  width {width:>4s}  accept {acc:>4s}  "
            f"{'exact' if row['exact'] else 'DIFFERS'}"
            + (f"  copies {' '.join(f'{x:.2f}x' for x in row['copy_speedups'])}"
               if len(row.get("copy_speedups") or ()) > 1 else ""))


def table(rows: list[dict]) -> str:
    """Markdown: one line per (run, batch size), one column per category, plus the mean over categories.
    exact: every output equals the plain engine's; "= greedy" (where rows carry greedy_matches): the prompts
    whose output equals plain greedy decoding of the prompt alone, out of all."""
    categories = list(dict.fromkeys(r["category"] for r in rows))
    keys = list(dict.fromkeys((r["run"], r["batch_size"]) for r in rows if r["run"] != "plain"))
    greedy = any("greedy_matches" in r for r in rows)
    head = ["run", "batch"] + [str(c) for c in categories] + (["mean"] if len(categories) > 1 else []) + \
        ["mean width", "exact"] + (["= greedy"] if greedy else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for run, batch in keys:
        cells = [r for r in rows if r["run"] == run and r["batch_size"] == batch]
        by = {r["category"]: r for r in cells}
        ups = [by[c]["speedup"] for c in categories if c in by]
        widths = [r["mean_width"] for r in cells if r.get("mean_width")]
        line = [run, str(batch)] + [f"{by[c]['speedup']:.2f}x" if c in by else "-" for c in categories]
        if len(categories) > 1:
            line.append(f"{sum(ups) / len(ups):.2f}x")
        line += [f"{sum(widths) / len(widths):.2f}" if widths else "-",
                 "yes" if all(r["exact"] for r in cells) else "NO"]
        if greedy:
            checked = [r for r in cells if "greedy_matches" in r]
            line.append(f"{sum(r['greedy_matches'] for r in checked)}/{sum(r['prompts'] for r in checked)}"
                        if checked else "-")
        lines.append("| " + " | ".join(line) + " |")
    return "\n".join(lines)
