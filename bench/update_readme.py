"""Put measured tables into README.md between their markers, from the JSON the measuring commands wrote.

    python bench/compare_ops.py --threads 1 --json results/ops_cpu.json
    python -m specdec demo --json results/demo.json
    python -m specdec ablate --quick --json results/ablation.json --plot docs/ablation.png
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
    from specdec.report import format_runs
    data = json.load(open(path))
    return f"```\n{data['header']}\n```\n\n" + format_runs(data["rows"], baseline=data["rows"][0]["tokens_per_s"])


def ablation_table(path):
    from specdec.report import format_runs, run_summary
    data = json.load(open(path))
    rows = []
    for r in data["runs"]:
        name = f"B={r['batch_size']} {r['scheduler']} {r['backend']}/{r['realign']}"
        stats = {"tokens_per_s": r["tokens_per_s"], "phase_seconds": r["phase_seconds"],
                 "acceptance_rate": r["acceptance_rate"], "mean_accepted_length": r.get("mean_accepted_length", 0)}
        rows.append(run_summary(name, stats, data["machine"]["threads"], exact=r["equivalence"]))
    return format_runs(rows) + f"\n\n({data['machine']['threads']} thread, {data['config']})"


SECTIONS = {"ops-table": ("results/ops_cpu.json", ops_table), "demo-table": ("results/demo.json", demo_table),
            "ablation-table": ("results/ablation.json", ablation_table)}


def main():
    readme_path = os.path.join(ROOT, "README.md")
    text = open(readme_path).read()
    for marker, (rel, build) in SECTIONS.items():
        path = os.path.join(ROOT, rel)
        if not os.path.exists(path):
            print(f"{rel} missing: {marker} left as it is")
            continue
        pattern = re.compile(f"(<!-- {marker} -->\n).*?(\n<!-- /{marker} -->)", re.S)
        text, n = pattern.subn(lambda m: m.group(1) + build(path) + m.group(2), text)
        print(f"{marker}: {'updated' if n else 'marker not found'}")
    open(readme_path, "w").write(text)


if __name__ == "__main__":
    main()
