"""The results table a person reads: throughput, acceptance, where each step's time goes, exactness."""

from __future__ import annotations

PHASES = ("draft", "verify", "sample", "realign", "schedule", "other")


def run_summary(name: str, stats: dict, threads: int, **extra) -> dict:
    phases = stats.get("phase_seconds", {})
    total = sum(phases.values()) or stats.get("total_seconds", 0.0) or 1e-12
    return {"run": name, "tokens_per_s": stats.get("tokens_per_s", 0.0), "total_seconds": total,
            "acceptance_rate": stats.get("acceptance_rate", 0.0),
            "mean_accepted_length": stats.get("mean_accepted_length", 0.0),
            "phase_share": {p: phases.get(p, 0.0) / total for p in PHASES},
            "phase_seconds": {p: phases.get(p, 0.0) for p in PHASES}, "threads": threads, **extra}


def format_runs(rows: list[dict], baseline: float | None = None) -> str:
    """Markdown table; `baseline` tokens/s gives a speed-up column."""
    head = ["run", "tokens/s"] + (["speed-up"] if baseline else []) + \
        ["accept", "tokens/step"] + [f"{p} %" for p in PHASES] + ["exact"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["run"], f"{r['tokens_per_s']:.1f}"]
        if baseline:
            cells.append(f"{r['tokens_per_s'] / baseline:.2f}x")
        cells += [f"{r['acceptance_rate']:.0%}" if r["acceptance_rate"] else "-",
                  f"{r['mean_accepted_length']:.2f}" if r["mean_accepted_length"] else "-"]
        cells += [f"{100 * r['phase_share'][p]:.1f}" for p in PHASES]
        cells.append(f"{r['exact']:.0%}" if r.get("exact") is not None else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
