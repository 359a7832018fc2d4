"""One rank of the tensor-parallel tests (tests/test_tp_decoding.py starts two of these with RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set): joins the gloo group, loads the spec's targets tensor-parallel from their folders
(transformers' TP plan) and its drafts whole, runs every case and writes what it decoded to OUT/rank<r>.json.

    python tests/tp_worker.py SPEC.json OUT_DIR

A spec may ask one rank to fail mid-run ("fail": {"rank": 1, "forward": 6, "how": "raise" | "hang"}): its 6th
target forward raises, or stalls for hang_seconds, so the tests can watch both processes end with an error.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

from engine_models import ScriptedController  # noqa: E402
from specdec import EarlyExitDrafter, NgramDrafter, SpeculativeDecoder  # noqa: E402
from specdec.models.hf import load_causal_lm  # noqa: E402
from specdec.scheduling.distributed import TensorParallelError, bound_collectives, init_process_group  # noqa: E402


class SkewedController(ScriptedController):
    """Widths and early stops from a script seeded by the RANK: left to themselves the ranks would plan different
    steps (as a timing-driven controller may), so the run is exact only if rank 0's decisions are shared."""

    def __init__(self, k: int, rank: int):
        super().__init__(k, seed=100 + rank)
        self.stops = random.Random(200 + rank)

    def keep_drafting(self, plan, drafted, keys, position_keys) -> bool:
        return drafted < plan.width - 1 and self.stops.random() < 0.8


def inject_failure(model, rank: int, fail: dict) -> None:
    if fail.get("rank") != rank:
        return
    forward, calls = model.forward, [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == fail["forward"]:
            if fail["how"] == "raise":
                raise RuntimeError(f"injected failure on rank {rank} at target forward {calls[0]}")
            time.sleep(fail["hang_seconds"])
        return forward(*args, **kwargs)

    model.forward = failing


def run_case(case: dict, targets: dict, drafts: dict, rank: int) -> dict:
    target = targets[case["target"]]
    kind = case.get("drafter")
    if kind == "early-exit":  # the sharded target's own first layer, over its own (sharded) cache
        drafter = EarlyExitDrafter(target, 1)
    else:
        drafter = drafts[case["draft"]] if kind == "model" else NgramDrafter() if kind == "ngram" else None
    k = case.get("k", 3)
    kwargs = {}
    control = case.get("control", "fixed")
    if control == "skewed":
        kwargs["controller"] = SkewedController(k, rank)
    if case.get("scheduler") == "exspec":
        kwargs["window"] = case.get("window", 4)
    dec = SpeculativeDecoder(target, drafter, num_draft_tokens=k, scheduler=case.get("scheduler", "eqspec"),
                             realign=case.get("realign", "shift"), adaptive=control == "adaptive",
                             tp_timeout=case.get("tp_timeout"), **kwargs)
    prompts = case.get("rank_prompts", {}).get(str(rank), case["prompts"])  # a rank given another call
    try:
        res = dec.generate(prompts, max_new_tokens=case["max_new"], batch_size=case.get("batch_size", 3),
                           eos_token_id=case.get("eos", []), do_sample=case.get("do_sample", False),
                           temperature=case.get("temperature", 1.0), top_k=case.get("top_k", 0),
                           top_p=case.get("top_p", 1.0), seed=case.get("seed"))
    except TensorParallelError as err:
        if not case.get("expect_error"):
            raise
        return {"error": str(err)}
    keep = ("steps", "width_histogram", "accept_histogram", "plain_steps", "tensor_parallel")
    return {"sequences": res.sequences, "stats": {name: res.stats.get(name) for name in keep}}


def main() -> int:
    spec_path, out_dir = sys.argv[1], sys.argv[2]
    with open(spec_path) as f:
        spec = json.load(f)
    torch.set_num_threads(1)
    rank, world = init_process_group("cpu", timeout=spec.get("timeout", 60))
    started = time.perf_counter()
    targets = {name: load_causal_lm(path, tp=world, require_tokenizer=False)[0]
               for name, path in spec["targets"].items()}
    drafts = {name: load_causal_lm(path, require_tokenizer=False)[0] for name, path in spec.get("drafts", {}).items()}
    loaded = time.perf_counter() - started
    bound_collectives(spec.get("timeout", 60))
    for model in targets.values():
        inject_failure(model, rank, spec.get("fail", {}))
    out = {"rank": rank, "world": world, "load_seconds": loaded, "cases": {},
           "local_kv_heads": {name: m.model.layers[0].self_attn.k_proj.weight.to_local().shape[0]
                              // m.config.head_dim for name, m in targets.items()}}
    for case in spec["cases"]:
        t = time.perf_counter()
        out["cases"][case["name"]] = run_case(case, targets, drafts, rank)
        out["cases"][case["name"]]["seconds"] = time.perf_counter() - t
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
