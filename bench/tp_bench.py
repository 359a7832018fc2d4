#!/usr/bin/env python3
"""What tensor parallelism costs in communication, on this machine: the embedded demo target (an 8-layer Llama,
hidden 256, 2 KV heads) sharded over 2 gloo processes on the CPU, beside the same model in one process.

    python bench/tp_bench.py [--out docs/tp_cpu.json] [--prompts 4] [--max-new-tokens 32] [--repeats 2]
    python bench/tp_bench.py --device cuda --out results/tp_gpu.json      (2 GPUs: NCCL; bench/gpu_check runs it)

It starts its own 2 processes (no launcher needed; each with 1 thread, the single-process run with 1 thread too)
and measures:
  1. collectives per forward: every gloo operation the profiler sees in one TP forward (transformers' own: an
     all-reduce after the vocabulary-sharded embedding, one after each layer's attention o_proj and MLP down_proj,
     an all-gather of the logits), for a verify-shaped forward and a 1-token one;
  2. time per collective: the decode loop's own step broadcast (int64, the outcome's shape) on its control group,
     and an all-reduce / all-gather of the sizes a verify forward moves, each the median of many after a barrier;
  3. a TP forward against the whole model's forward of the same shape;
  4. end to end: tokens/s of plain decoding and EQSPEC (n-gram, the layer-skip draft replicated and the target's
     early exit sharded with it, fixed K and adaptive) on the
     same prompts, single process against 2 ranks, with the loop's own collectives per step from the stats.
On CPU and a model this small TP is slower (the collectives cost about what the math does); the point is that the
step adds only its one small collective to transformers' 2 * layers + 2 per forward.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from specdec import EarlyExitDrafter, NgramDrafter, SpeculativeDecoder  # noqa: E402
from specdec.models.demo import DRAFT_LAYERS, build_default_pair, shipped_prompts  # noqa: E402
from specdec.models.hf import load_causal_lm  # noqa: E402
from specdec.scheduling.distributed import (TensorParallelRanks, bound_collectives, init_process_group,  # noqa: E402
                                             local_device)

REPO = pathlib.Path(__file__).resolve().parents[1]
WORLD = 2
VERIFY_ROWS, VERIFY_WIDTH, K = 4, 5, 4

RUNS = [  # name, drafter, adaptive
    ("autoregressive", None, False),
    ("eqspec n-gram, fixed K=4", "ngram", False),
    ("eqspec layer-skip draft, fixed K=4", "model", False),
    ("eqspec layer-skip draft, adaptive", "model", True),
    ("eqspec layer-skip early exit, fixed K=4", "early-exit", False),  # sharded with the target
    ("eqspec layer-skip early exit, adaptive", "early-exit", True),
]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn, n: int, device: torch.device) -> float:
    fn()
    times = []
    for _ in range(n):
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _ids(rows: int, width: int, device: torch.device) -> torch.Tensor:
    return torch.randint(0, 256, (rows, width), generator=torch.Generator().manual_seed(0)).to(device)


@torch.no_grad()
def forward_seconds(model, rows: int, width: int, device: torch.device, n: int = 20) -> float:
    ids = _ids(rows, width, device)
    return _median_seconds(lambda: model(ids), n, device)


@torch.no_grad()
def count_collectives(model, rows: int, width: int, device: torch.device) -> dict:
    ids = _ids(rows, width, device)
    model(ids)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        model(ids)
    counts: dict = {}
    for event in prof.events():
        if event.name.startswith(("gloo:", "nccl:")):
            counts[event.name] = counts.get(event.name, 0) + 1
    return counts


def collective_seconds(ranks: TensorParallelRanks, hidden: int, vocab: int, device: torch.device,
                       n: int = 300) -> dict:
    dist = torch.distributed
    tokens = VERIFY_ROWS * VERIFY_WIDTH
    outcome = torch.zeros(VERIFY_ROWS, 1 + VERIFY_WIDTH + 2 * K, dtype=torch.int64)
    plan = torch.zeros(1 + VERIFY_ROWS, dtype=torch.int64)
    activations = torch.zeros(tokens, hidden, device=device)
    logits = torch.zeros(tokens, vocab // WORLD, device=device)
    gathered = torch.zeros(WORLD * tokens, vocab // WORLD, device=device)
    out = {}
    for name, fn in (
            ("step broadcast, int64 [4, 14], control group", lambda: dist.broadcast(outcome, 0, group=ranks.group)),
            ("plan broadcast, int64 [5], control group", lambda: dist.broadcast(plan, 0, group=ranks.group)),
            (f"all-reduce float32 [{tokens}, {hidden}] (a layer's, verify width 5)",
             lambda: dist.all_reduce(activations)),
            (f"all-gather float32 [{tokens}, {vocab // WORLD}] (the logits)",
             lambda: dist.all_gather_into_tensor(gathered, logits))):
        dist.barrier()
        out[name] = _median_seconds(fn, n, device) * 1e6
    return out


@torch.no_grad()
def logits_agreement(target, whole, device: torch.device) -> dict:
    """Are the ranks' logits bitwise equal, and how far are they from the whole model's?"""
    ids = _ids(VERIFY_ROWS, VERIFY_WIDTH, device)
    mine = target(ids).logits.contiguous()
    every = [torch.empty_like(mine) for _ in range(WORLD)]
    torch.distributed.all_gather(every, mine)
    return {"bitwise_equal_across_ranks": all(torch.equal(every[0], other) for other in every[1:]),
            "max_abs_diff_vs_whole_model": float((mine - whole(ids).logits).abs().max())}


def decode(target, draft_model, prompts, max_new: int, repeats: int) -> dict:
    out = {}
    for name, drafter, adaptive in RUNS:
        if drafter == "early-exit":
            draft = EarlyExitDrafter(target, DRAFT_LAYERS)
        else:
            draft = None if drafter is None else NgramDrafter() if drafter == "ngram" else draft_model
        dec = SpeculativeDecoder(target, draft, num_draft_tokens=K, adaptive=adaptive,
                                 scheduler="autoregressive" if drafter is None else "eqspec")
        dec.generate(prompts, max_new_tokens=8, batch_size=len(prompts), eos_token_id=[])  # warm-up
        best = None
        for _ in range(repeats):
            res = dec.generate(prompts, max_new_tokens=max_new, batch_size=len(prompts), eos_token_id=[])
            if best is None or res.stats["tokens_per_s"] > best.stats["tokens_per_s"]:
                best = res
        stats = best.stats
        row = {"tokens_per_s": stats["tokens_per_s"], "steps": stats["steps"],
               "mean_width": stats.get("mean_width"), "phase_seconds": stats["phase_seconds"],
               "sequences": best.sequences}
        tp = stats.get("tensor_parallel")
        if tp is not None:
            row["loop_collectives"] = tp["collectives_by_kind"]
            row["loop_collectives_per_step"] = tp["collectives"] / stats["steps"]
            row["loop_collective_seconds"] = tp["collective_seconds"]
            row["disagreements"] = tp["disagreements"]
        out[name] = row
    return out


def measure(target, draft, prompts, args, ranks: TensorParallelRanks | None) -> dict:
    config, device = target.config, next(target.parameters()).device
    shapes = ((VERIFY_ROWS, VERIFY_WIDTH), (VERIFY_ROWS, 1))
    out = {"forward_seconds": {str(list(shape)): forward_seconds(target, *shape, device) for shape in shapes}}
    if ranks is not None:
        out["collectives_per_forward"] = {str(list(shape)): count_collectives(target, *shape, device)
                                          for shape in shapes}
        out["collective_microseconds"] = collective_seconds(ranks, config.hidden_size, config.vocab_size, device)
    out["decode"] = decode(target, draft, prompts, args.max_new_tokens, args.repeats)
    return out


def worker(spec_path: str, out_dir: str) -> int:
    spec = json.loads(pathlib.Path(spec_path).read_text())
    torch.set_num_threads(1)
    rank, world = init_process_group(spec["device"], timeout=120)
    target = load_causal_lm(spec["target"], tp=world, require_tokenizer=False)[0]
    draft = load_causal_lm(spec["draft"], device=local_device(spec["device"]), require_tokenizer=False)[0]
    bound_collectives(120)
    ranks = TensorParallelRanks(world)
    args = argparse.Namespace(**spec["args"])
    whole = load_causal_lm(spec["target"], device=local_device(spec["device"]), require_tokenizer=False)[0]
    agreement = logits_agreement(target, whole, local_device(spec["device"]))
    del whole
    result = {"logits": agreement, **measure(target, draft, spec["prompts"], args, ranks)}
    pathlib.Path(out_dir, f"rank{rank}.json").write_text(json.dumps(result))
    torch.distributed.destroy_process_group()
    return 0


def launch(spec: dict, folder: pathlib.Path) -> list[dict]:
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", str(spec_path), str(folder)], env=env))
    codes = [p.wait(timeout=900) for p in procs]
    if codes != [0] * WORLD:
        raise SystemExit(f"the TP workers failed: exit codes {codes}")
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(WORLD)]


def table(single: dict, tp: dict) -> str:
    lines = ["| run | 1 process tok/s | 2 ranks tok/s | TP / 1 | steps | loop collectives / step | loop collective ms "
             "| greedy equal |", "|---|---|---|---|---|---|---|---|"]
    for name, *_ in RUNS:
        a, b = single["decode"][name], tp["decode"][name]
        lines.append(f"| {name} | {a['tokens_per_s']:.0f} | {b['tokens_per_s']:.0f} | "
                     f"{b['tokens_per_s'] / a['tokens_per_s']:.2f} | {b['steps']} | "
                     f"{b['loop_collectives_per_step']:.2f} | {b['loop_collective_seconds'] * 1e3:.1f} | "
                     f"{a['sequences'] == b['sequences']} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(REPO / "docs" / "tp_cpu.json"))
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per configuration (the best is kept)")
    parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    parser.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(*args.worker)
    torch.set_num_threads(1)
    target, draft, tokenizer = build_default_pair()
    prompts = [tokenizer.encode(p["text"])[:48] for p in shipped_prompts()[:args.prompts]]
    with tempfile.TemporaryDirectory(prefix="tp_bench_") as tmp:
        folder = pathlib.Path(tmp)
        target.save_pretrained(folder / "target")
        draft.save_pretrained(folder / "draft")
        spec = {"target": str(folder / "target"), "draft": str(folder / "draft"), "prompts": prompts,
                "device": args.device,
                "args": {"max_new_tokens": args.max_new_tokens, "repeats": args.repeats}}
        started = time.perf_counter()
        tp = launch(spec, folder)
        tp_seconds = time.perf_counter() - started
    device = torch.device(args.device)
    single = measure(target.to(device), draft.to(device), prompts, args, None)
    config = target.config
    report_backend = "nccl" if device.type == "cuda" else "gloo"
    report = {
        "command": "python bench/tp_bench.py " + " ".join(sys.argv[1:]),
        "machine": {"cpu_count": os.cpu_count(), "load_average": os.getloadavg(), "torch": torch.__version__,
                    "python": platform.python_version(), "threads_per_process": 1,
                    "backend": report_backend, "control_group": "gloo",
                    "gpu": torch.cuda.get_device_name() if device.type == "cuda" else None},
        "model": {"name": "embedded demo target (specdec.models.demo)", "layers": config.num_hidden_layers,
                  "hidden": config.hidden_size, "heads": config.num_attention_heads,
                  "kv_heads": config.num_key_value_heads, "vocab": config.vocab_size},
        "prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "batch_size": len(prompts),
        "expected_collectives_per_forward": {f"{report_backend}:all_reduce": 2 * config.num_hidden_layers + 1,
                                             f"{report_backend}:all_gather": 1},
        "tp_rank0": tp[0], "tp_rank1_decode_equal": tp[0]["decode"] == tp[1]["decode"] or
        all(tp[0]["decode"][n]["sequences"] == tp[1]["decode"][n]["sequences"] for n, *_ in RUNS),
        "single_process": single, "tp_wall_seconds": tp_seconds,
    }
    report["table"] = table(single, tp[0])
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report["tp_rank0"][k] for k in ("logits", "collectives_per_forward",
                                                          "collective_microseconds")},
                     indent=1))
    print("forward seconds, 1 process:", single["forward_seconds"], " 2 ranks:", tp[0]["forward_seconds"])
    print(report["table"])
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
