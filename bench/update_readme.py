"""Put measured tables into README.md between their markers, from the JSON the measuring commands wrote.

    python bench/compare_ops.py --threads 1 --json docs/ops_cpu.json
    python -m specdec demo --json docs/demo.json
    python -m specdec ablate --quick --json docs/ablation.json --plot docs/ablation.png
    python -m specdec real-demo --prompts ../shared/data/spec_bench_questions.jsonl --per-category 3 \
        --max-new-tokens 64 --transformers --json docs/real_demo_specbench.json
    python bench/speculation.py --json docs/speculation_demo.json
    python bench/plain_vs_transformers.py --target ~/.cache/specdec/smollm2-135m-instruct \
        --prompts ../shared/data/spec_bench_questions.jsonl --per-category 3 --json docs/plain_vs_transformers.json
    python bench/update_readme.py
A table whose JSON is missing is left as it is.
"""

import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def ops_table(path):
    from specdec_kernels.microbench import Row, format_table
    data = json.load(open(path))
    rows = [Row(r["op"], r["size"], r["backend"], r["median_ms"], r["gbytes"]) for r in data["rows"]]
    m = data["machine"]
    return f"{format_table(rows)}\n\n({m['threads']} thread, {m['device']}, torch {m['torch']})"


def demo_table(path):
    from specdec.apps.report import format_runs
    data = json.load(open(path))
    return f"```\n{data['header']}\n```\n\n" + format_runs(data["rows"], baseline=data["rows"][0]["tokens_per_s"])


def ablation_table(path):
    data = json.load(open(path))
    lines = ["| batch | scheduler | kernels | realign | tokens/s | realign ms | realign % of time | "
             "realign % of overhead | group rate | exact |", "|---:|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in data["runs"]:
        total = sum(r["phase_seconds"].values())
        group = f"{r['group_rate']:.2f}" if r.get("group_rate") is not None else "-"
        lines.append(f"| {r['batch_size']} | {r['scheduler']} | {r['backend']} | {r['realign']} | "
                     f"{r['tokens_per_s']:.0f} | {1e3 * r['phase_seconds']['realign']:.0f} | "
                     f"{100 * r['phase_seconds']['realign'] / total:.1f} | "
                     f"{100 * r.get('realign_share_of_overhead', 0):.0f} | {group} | {r['equivalence']:.0%} |")
    m, c = data["machine"], data["config"]
    return "\n".join(lines) + (f"\n\n({m['threads']} thread, {m['device']}; {c['prompts']} prompts, "
                               f"{c['max_new_tokens']} new tokens, K={c['num_draft_tokens']}; {c['models']})")


def real_demo_table(path):
    """real-demo's own table (speed-up per category and batch size, exactness) under its header."""
    data = json.load(open(path))
    return f"```\n{data['header']}\n```\n\n{data['table']}"


def speculation_table(path):
    """bench/speculation.py: speed-ups per drafter, controller on and fixed K, under its header."""
    from specdec.apps.speed import table
    data = json.load(open(path))
    return f"```\n{data['header']}\n```\n\n{table(data['rows'])}"


def plain_vs_transformers_table(path):
    """bench/plain_vs_transformers.py: the engine's plain decoding over transformers' generate, per category."""
    from plain_vs_transformers import table  # this folder's script
    data = json.load(open(path))
    return f"```\n{data['header']}\n```\n\n{table(data['rows'])}"


def engine_phases_table(path):
    data = json.load(open(path))
    lines = ["| kernels | realign | tokens/s | realign s | realign % | engine overhead % |", "|---|---|---:|---:|---:|---:|"]
    for r in data["rows"]:
        lines.append(f"| {r['backend']} | {r['realign']} | {r['tokens_per_s']:.0f} | {r['realign_s']:.3f} | "
                     f"{100 * r['realign_share']:.1f} | {100 * r['overhead_share']:.1f} |")
    return "\n".join(lines) + f"\n\n({data['threads']} thread)"


SECTIONS = {"ops-table": ("docs/ops_cpu.json", ops_table), "demo-table": ("docs/demo.json", demo_table),
            "ablation-table": ("docs/ablation.json", ablation_table),
            "ablation-smollm2-table": ("docs/ablation_smollm2.json", ablation_table),
            "real-demo-table": ("docs/real_demo_specbench.json", real_demo_table),
            "real-demo-shipped-table": ("docs/real_demo.json", real_demo_table),
            "real-demo-gemma3-table": ("docs/real_demo_gemma3.json", real_demo_table),
            "real-demo-smollm2-extra-table": ("docs/real_demo_smollm2_fp16_earlyexit.json", real_demo_table),
            "speculation-demo-table": ("docs/speculation_demo.json", speculation_table),
            "plain-vs-transformers-table": ("docs/plain_vs_transformers.json", plain_vs_transformers_table),
            "engine-phases-table": ("docs/engine_phases.json", engine_phases_table)}


def main():
    readme_path = os.path.join(ROOT, "README.md")
    text = open(readme_path).read()
    for marker, (rel, build) in SECTIONS.items():
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            print(f"{rel} missing: {marker} left as it is")
            continue
        pattern = re.compile(f"(<!-- {marker} -->\n)(?:.*?\n)?(<!-- /{marker} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + build(path) + "\n" + m.group(2), text)
        print(f"{marker}: {'updated' if n else 'marker not found'}")
    open(readme_path, "w").write(text)


if __name__ == "__main__":
    main()
