"""The results table a person reads: throughput, acceptance, the speculation controller's widths, where each
step's time goes, exactness; and merge_stats, which adds up the stats of several generate() calls (the
categories of one run) into one."""

from __future__ import annotations

PHASES = ("draft", "verify", "sample", "realign", "schedule", "other")


def run_summary(name: str, stats: dict, threads: int, **extra) -> dict:
    phases = stats.get("phase_seconds", {})
    total = sum(phases.values()) or stats.get("total_seconds", 0.0) or 1e-12
    recorded = sum(stats.get("width_histogram") or [])
    return {"run": name, "tokens_per_s": stats.get("tokens_per_s", 0.0), "total_seconds": total,
            "acceptance_rate": stats.get("acceptance_rate", 0.0),
            "mean_accepted_length": stats.get("mean_accepted_length", 0.0),
            # the controller's verify width per step (1 = a plain step), None without a drafter
            "mean_width": stats.get("mean_width"),
            "plain_share": stats.get("plain_steps", 0) / recorded if recorded else None,
            "phase_share": {p: phases.get(p, 0.0) / total for p in PHASES},
            "phase_seconds": {p: phases.get(p, 0.0) for p in PHASES}, "threads": threads, **extra}


def format_runs(rows: list[dict], baseline: float | None = None) -> str:
    """Markdown table; `baseline` tokens/s gives a speed-up column."""
    head = ["run", "tokens/s"] + (["speed-up"] if baseline else []) + \
        ["accept", "tokens/step", "mean width", "plain %"] + [f"{p} %" for p in PHASES] + ["exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], f"{r['tokens_per_s']:.1f}"]
        if baseline:
            cells.append(f"{r['tokens_per_s'] / baseline:.2f}x")
        width, plain = r.get("mean_width"), r.get("plain_share")
        cells += [f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] else "-",
                  f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-",
                  f"{width:.2f}" if width else "-", f"{100 * plain:.0f}" if plain is not None else "-"]
        cells += [f"{100 * r['phase_share'][p]:.1f}" for p in PHASES]
        cells.append(f"{r['exact']:.0%}" if r.get("exact") is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# How merge_stats combines a key: counters add up; rates are recomputed from the summed counters; per-step and
# per-group means are weighted by the steps / groups they average over; settings are the first call's.
_SUMMED = ("steps", "drafted", "accepted", "ragged_steps", "new_tokens", "total_seconds", "prefill_seconds",
           "draft_prefill_seconds", "control_seconds", "catch_up_columns", "resumed_columns", "plain_steps",
           "explore_steps", "judged_drafts", "compactions", "groups")
_SUMMED_LISTS = ("accept_histogram", "width_histogram")
_SUMMED_DICTS = ("phase_seconds", "cut_blocks")
_PER_STEP = ("predicted_tokens_per_step", "realised_tokens_per_step")
_PER_GROUP = ("group_rate", "mean_group_rows", "padding_fraction")


def merge_stats(parts: list[dict]) -> dict:
    """The stats of one generate() call over all the prompts of `parts` (each a GenerationResult.stats)."""
    if len(parts) == 1:
        return dict(parts[0])
    out = dict(parts[0])
    for key in _SUMMED:
        if key in out:
            out[key] = sum(p.get(key, 0) for p in parts)
    for key in _SUMMED_LISTS:
        if key in out:
            size = max(len(p.get(key) or []) for p in parts)
            out[key] = [sum((p.get(key) or [])[i] if i < len(p.get(key) or []) else 0 for p in parts)
                        for i in range(size)]
    for key in _SUMMED_DICTS:
        if key in out:
            names = list(dict.fromkeys(n for p in parts for n in p.get(key, {})))
            out[key] = {n: sum(p.get(key, {}).get(n, 0) for p in parts) for n in names}
    _weighted(out, parts, _PER_STEP, lambda p: sum(p.get("width_histogram") or []))
    _weighted(out, parts, _PER_GROUP, lambda p: p.get("groups", 0))
    if "drafted" in out:
        out["acceptance_rate"] = out["accepted"] / out["drafted"] if out["drafted"] else 0.0
    if "accept_histogram" in out:
        row_steps = sum(out["accept_histogram"])
        out["mean_accepted_length"] = (out["accepted"] + row_steps) / row_steps if row_steps else 0.0
    if "phase_seconds" in out:
        total = sum(out["phase_seconds"].values())
        out["total_seconds"] = total
        out["tokens_per_s"] = out.get("new_tokens", 0) / total if total > 0 else 0.0
    if "width_histogram" in out:
        hist = out["width_histogram"]  # steps per verify width 1 .. K + 1
        out["mean_width"] = sum((w + 1) * n for w, n in enumerate(hist)) / sum(hist) if sum(hist) else 0.0
    return out


def _weighted(out: dict, parts: list[dict], keys, weight) -> None:
    total = sum(weight(p) for p in parts)
    for key in keys:
        if key in out:
            out[key] = sum(p.get(key, 0.0) * weight(p) for p in parts) / total if total else 0.0
