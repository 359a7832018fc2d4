"""`python -m specdec` / `specdec`: the main job (run), the embedded demo (demo) and the ablation (ablate).

    specdec run                              embedded target/draft pair on the shipped prompts, per category
    specdec run --target DIR --drafter ngram a local Hugging Face model with prompt-lookup drafting
    specdec run --target DIR --draft-dtype float16 --check
    specdec run --target DIR --scheduler autoregressive    plain batched decoding, no drafter
    python -m torch.distributed.run --nproc-per-node 2 -m specdec run --target DIR --tp 2 --drafter ngram
                                             the target sharded over 2 processes (transformers' TP plan)
    specdec demo                             autoregressive vs EQSPEC (model and n-gram drafts), with --check
    specdec real-demo                        SmolLM2-135M (make real-demo installs it): SpecBench-style categories,
                                             batch 1/4/8, n-gram and float16-copy drafters, adaptive and fixed K
    specdec ablate --quick --json F --plot F.png             the embedded pair; --target DIR for a real model

Speculation is adaptive by default: the speculation controller picks each step's verify width (1..K+1) and each
row's draft count from measured forward costs and acceptance, down to plain decoding where drafting does not pay;
--fixed-k verifies K drafts every step. Output is exact either way.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import sys
import tempfile

import torch

import specdec_kernels as sk

from ..decoder import SpeculativeDecoder
from ..drafting.ngram import NgramDrafter
from ..models.demo import DRAFT_LAYERS, build_default_pair
from ..models.hf import load_causal_lm
from ..sampling import SamplingConfig
from ..scheduling.distributed import (DEFAULT_TIMEOUT, TensorParallelError, distributed_available,
                                      init_process_group, local_device)
from ..validation import check_seed
from .ablation import run_ablation
from .check import check_against_greedy
from .demo import run_demo
from .loading import DTYPES, check_drafter_flags, check_model_folder, early_exit_drafter, folder_name, load_draft
from .progress import Progress
from .prompts import encode, load_prompt_records, load_prompts
from .real_demo import DRAFTERS, MODELS, OPTIONAL_DRAFTERS, run_real_demo
from .report import format_runs, merge_stats, run_summary


THREADS_DEFAULT = int(os.environ.get("SPECDEC_THREADS", "1"))


def _add_model_args(p: argparse.ArgumentParser, draft_default: str) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", help="local Hugging Face causal LM folder (default: the embedded demo pair)")
    g.add_argument("--draft", help="local Hugging Face folder of the draft model (same tokenizer)")
    g.add_argument("--drafter", choices=("model", "ngram", "early-exit"), default="model",
                   help="draft model, prompt-lookup n-gram drafting (no model), or the target's own first "
                        "--exit-layer layers over its own cache (self-speculation)")
    g.add_argument("--exit-layer", type=int, default=None, metavar="L",
                   help="--drafter early-exit: the target layers it drafts with (default: the embedded pair's 2, "
                        "a quarter of a --target's layers)")
    g.add_argument("--draft-dtype", choices=tuple(DTYPES), default=None,
                   help=f"use a copy of the target's weights in this dtype as the draft model ({draft_default})")
    g.add_argument("--no-chat-template", action="store_true", help="feed prompts raw, not through a chat template")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--scheduler", choices=("eqspec", "exspec", "autoregressive"), default="eqspec",
                   help="autoregressive: plain batched decoding, no drafter (the baseline)")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--window", type=int, default=32, help="EXSPEC: how many sequences the pool holds")
    g.add_argument("--num-draft-tokens", "-k", type=int, default=4,
                   help="K: the most drafts per row in one step (default 4)")
    g.add_argument("--fixed-k", action="store_true",
                   help="verify K drafts every step (the speculation controller, on by default, picks each step's "
                        "verify width 1..K+1 from measured costs and acceptance, down to plain decoding)")
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--prompts", help="jsonl with a 'text' field (or SpecBench 'turns'; 'category' is used), or "
                                     "text, one per line; 'specbench-style' is the shipped SpecBench-style set")
    g.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    g.add_argument("--per-category", type=int, default=None, metavar="N",
                   help="use only the first N prompts of each category")
    g.add_argument("--pooled", action="store_true",
                   help="decode all prompts in one generate() call (default: one call per category, one row each)")
    g.add_argument("--backend", choices=("auto", "torch", "cpp", "triton"), default=None)
    g.add_argument("--realign", choices=("shift", "mask", "paper"), default=None,
                   help="how rows are realigned after each step (default: the engine's)")
    g.add_argument("--do-sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    g.add_argument("--device", default="cpu")


def _add_tp_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("tensor parallel (launch with python -m torch.distributed.run --nproc-per-node N)")
    g.add_argument("--tp", type=int, default=1, metavar="N",
                   help="shard the --target over N processes with transformers' tensor-parallel plan (gloo on "
                        "CPU, NCCL on GPUs; needs accelerate: pip install 'specdec_kernels[tp]'); the draft "
                        "runs whole on every rank; only rank 0 prints and writes --json")
    g.add_argument("--tp-timeout", type=float, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help="a rank that waits this long for the others in a collective ends the run with an "
                        f"error (default {DEFAULT_TIMEOUT:g})")


def _add_real_demo_args(real: argparse.ArgumentParser) -> None:
    real.add_argument("--target", help="local Hugging Face folder (default: --model, converted once)")
    real.add_argument("--model", choices=tuple(MODELS), default="smollm2",
                      help="which shipped real model: SmolLM2-135M-Instruct or Gemma 3 270M (sliding windows)")
    real.add_argument("--prompts", default="specbench-style",
                      help="prompts file with categories (default: the shipped SpecBench-style set; here: "
                           "--prompts ../shared/data/spec_bench_questions.jsonl --per-category 5)")
    real.add_argument("--per-category", type=int, default=2, metavar="N", help="first N prompts of each category")
    real.add_argument("--limit", type=int, default=None, help="at most N prompts in all")
    real.add_argument("--max-new-tokens", type=int, default=48)
    real.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 4, 8], metavar="B")
    real.add_argument("--repeats", type=int, default=2, help="timed runs of every configuration, in a shuffled order")
    real.add_argument("--whole-cell", action="store_true",
                      help="run each configuration over a whole cell at a time, not block by block (one batch of "
                           "prompts, every configuration in turn: runs of a block are seconds apart, so the "
                           "machine's drift weighs less on their ratio)")
    real.add_argument("--num-draft-tokens", "-k", type=int, default=4, help="K, the most drafts per row per step")
    real.add_argument("--drafters", nargs="+", choices=tuple(DRAFTERS) + tuple(OPTIONAL_DRAFTERS),
                      default=list(DRAFTERS),
                      help="n-gram prompt lookup and/or the target's float16 copy (default); earlyexit: the "
                           "target's own first quarter of layers over its own cache")
    real.add_argument("--no-fixed", action="store_true", help="only the controller (adaptive), no fixed-K runs")
    real.add_argument("--transformers", action="store_true",
                      help="also time transformers' generate: prompt lookup and assisted at batch 1 (per prompt), "
                           "plain generate over left-padded batches above 1")
    real.add_argument("--no-check", action="store_true",
                      help="skip comparing every output with plain greedy decoding (target.generate per prompt)")
    real.add_argument("--no-chat-template", action="store_true", help="feed prompts raw, not through a chat template")
    real.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    real.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                      help="time runs by wall clock, or by the process's CPU time (a shared machine: with one "
                           "thread it counts the work, not the waiting)")
    real.add_argument("--json", dest="json_out", default=None, help="write rows, header and command line here")


def _add_ablate_args(ablate: argparse.ArgumentParser) -> None:
    _add_model_args(ablate, "with --target, the default draft is its float16 copy")
    ablate.add_argument("--quick", action="store_true", help="batch sizes 1 and 8, fewer prompts (< 5 min here)")
    ablate.add_argument("--json", dest="json_out", default="results/ablation.json")
    ablate.add_argument("--plot", default=None)
    ablate.add_argument("--device", default="cpu")
    ablate.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    ablate.add_argument("--prompts", default=None)
    ablate.add_argument("--limit", type=int, default=None, help="prompts (default 8 with --quick, else 24)")
    ablate.add_argument("--max-new-tokens", type=int, default=None)
    ablate.add_argument("--batch-sizes", type=int, nargs="+", default=None, metavar="B",
                        help="default 1 8 with --quick, else 1 2 4 8 16")
    ablate.add_argument("--num-draft-tokens", "-k", type=int, default=4, help="K, drafted every step (fixed K)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="decode prompts and print throughput, acceptance, phases, exactness",
                         description="Decode prompts and print throughput, acceptance, the controller's mean verify "
                                     "width, phases and exactness; one row per prompt category and the total. The "
                                     "speculation controller is on by default (--fixed-k turns it off).")
    _add_model_args(run, "with --target: give this, --draft or --drafter ngram")
    _add_decode_args(run)
    _add_tp_args(run)
    run.add_argument("--check", action="store_true", help="also run plain greedy decoding and compare per prompt")
    run.add_argument("--json", dest="json_out", help="write the summary, every stat and per-prompt checks here")
    run.add_argument("--show", type=int, default=2, help="print the text of the first N outputs")
    demo = sub.add_parser("demo", help="the embedded pair: autoregressive vs EQSPEC with a model and n-gram draft")
    demo.add_argument("--threads", type=int, default=THREADS_DEFAULT)
    demo.add_argument("--backend", choices=("auto", "torch", "cpp", "triton"), default=None)
    demo.add_argument("--json", dest="json_out", default=None, help="also write the table's numbers here")
    real = sub.add_parser("real-demo", help="SmolLM2-135M-Instruct, SpecBench-style: plain vs n-gram vs float16 copy",
                          description="Per prompt category and batch size: plain batched decoding against EQSPEC "
                                      "with each drafter, with the speculation controller and with fixed K, every "
                                      "output checked against plain greedy decoding. Batch sizes larger than a "
                                      "category's prompt count run on all categories' prompts mixed.")
    _add_real_demo_args(real)
    ablate = sub.add_parser("ablate", help="schedulers x backends x batch sizes, with phase shares and a plot")
    _add_ablate_args(ablate)
    return parser


def load_models(args):
    """(target, draft model or drafter, tokenizer, description); no drafter for --scheduler autoregressive."""
    if args.target:
        target, tokenizer = load_causal_lm(args.target, device=args.device, tp=args.tp)
        name = folder_name(args.target)
        if args.scheduler == "autoregressive":
            return target, None, tokenizer, f"{name}, no drafter"
        draft, what = load_draft(target, tokenizer, draft=args.draft, drafter=args.drafter,
                                 draft_dtype=args.draft_dtype, device=args.device, exit_layer=args.exit_layer)
        return target, draft, tokenizer, f"{name} + {what}"
    target, draft, tokenizer = build_default_pair()
    target, draft = target.to(args.device), draft.to(args.device)
    if args.scheduler == "autoregressive":
        return target, None, tokenizer, "embedded 8-layer Llama, no drafter"
    if args.drafter == "ngram":
        return target, NgramDrafter(), tokenizer, "embedded 8-layer Llama + n-gram drafter"
    if args.drafter == "early-exit":
        drafter, what = early_exit_drafter(target, args.exit_layer or DRAFT_LAYERS)
        return target, drafter, tokenizer, f"embedded 8-layer Llama + {what}"
    if args.draft_dtype:
        draft = draft.to(DTYPES[args.draft_dtype])
    return target, draft, tokenizer, "embedded 8-layer Llama + its 2-layer layer-skip draft"


def category_groups(records, pooled: bool) -> dict:
    """{category: [prompt indexes]} in first-seen order; one group "all" for prompts without categories or with
    --pooled."""
    if pooled or all(category is None for category, _ in records):
        return {"all": list(range(len(records)))}
    groups: dict = {}
    for index, (category, _) in enumerate(records):
        groups.setdefault("(none)" if category is None else category, []).append(index)
    return groups


def cmd_run(args) -> dict:
    # a bad prompts file is an error before any model work
    records = load_prompt_records(args.prompts, args.limit, args.per_category)
    torch.set_num_threads(args.threads)
    leader = True
    if args.tp > 1:  # join the ranks before loading: the load shards the target over them
        rank, _ = init_process_group(args.device, args.tp_timeout)
        args.device, leader = str(local_device(args.device)), rank == 0
        if not leader:  # the other ranks decode alongside rank 0, which alone reports
            sys.stdout, args.json_out = open(os.devnull, "w"), None
    target, draft, tokenizer, description = load_models(args)
    ids = encode(tokenizer, [text for _, text in records], not args.no_chat_template)
    kwargs = {"realign": args.realign} if args.realign else {}
    if args.scheduler == "exspec":
        kwargs["window"] = args.window
    decoder = SpeculativeDecoder(target, None if args.scheduler == "autoregressive" else draft,
                                 num_draft_tokens=args.num_draft_tokens, scheduler=args.scheduler,
                                 backend=args.backend, adaptive=not args.fixed_k, tp_timeout=args.tp_timeout,
                                 **kwargs)
    mode = "" if args.scheduler == "autoregressive" else (
        f", fixed K={args.num_draft_tokens}" if args.fixed_k else f", adaptive K<={args.num_draft_tokens}")
    name = f"{args.scheduler}{mode} ({description})"
    groups = category_groups(records, args.pooled)
    sequences: list = [None] * len(ids)
    parts = {}
    with Progress(len(ids), "decoding") if leader else contextlib.nullcontext() as bar:
        # one decoder for every category: what the controller learned about costs carries over, as in serving
        for category, indexes in groups.items():
            result = decoder.generate([ids[i] for i in indexes], max_new_tokens=args.max_new_tokens,
                                      batch_size=args.batch_size, do_sample=args.do_sample,
                                      temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                      seed=args.seed, progress=bar)
            parts[category] = result.stats
            for i, seq in zip(indexes, result.sequences):
                sequences[i] = seq
    stats = merge_stats(list(parts.values()))
    checks = None
    if args.check:
        checks = check_against_greedy(target, ids, sequences, args.max_new_tokens, stats.get("eos"))
    rows = []
    if len(groups) > 1:
        for category, indexes in groups.items():
            rows.append({**run_summary(category, parts[category], args.threads, prompts=len(indexes),
                                       exact=_exact(checks, indexes)), "stats": parts[category]})
    summary = {**run_summary(name if len(groups) == 1 else f"total ({len(ids)} prompts)", stats, args.threads,
                             prompts=len(ids), exact=_exact(checks, range(len(ids)))), "stats": stats}
    if len(groups) > 1:
        print(f"{name}: {len(groups)} categories, each its own generate() call")
    print(format_runs(rows + [summary]))
    for i, seq in enumerate(sequences[:args.show]):
        print(f"\n[{i}] {tokenizer.decode(seq, skip_special_tokens=True)!r}")
    if checks is not None:
        _print_checks(checks)
    if args.json_out:
        write_json(args.json_out, {"command": args.command_line, "run": name, "summary": summary,
                                   "categories": rows, "checks": checks, "sequences": sequences}, "--json")
    return summary


def _exact(checks, indexes) -> float | None:
    if checks is None:
        return None
    indexes = list(indexes)
    return sum(checks[i]["exact"] for i in indexes) / len(indexes) if indexes else None


def write_json(path: str, data, flag: str = "--json") -> None:
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
    except OSError as e:
        raise ValueError(f"{flag} {path!r} cannot be written ({e.strerror or e})") from None


# ------------------------------------------------------------------------------------------- argument checks
def check_args(args) -> None:
    """Every flag of a parsed command line, checked before any model work: a ValueError naming the flag."""
    _at_least(args.threads, 1, "--threads")
    if args.command == "run":
        _check_run(args)
    elif args.command == "demo":
        _check_backend(args.backend, torch.device("cpu"))
        check_output(args.json_out, "--json")
    elif args.command == "real-demo":
        _check_real_demo(args)
    elif args.command == "ablate":
        _check_ablate(args)


def _check_run(args) -> None:
    for value, low, flag in ((args.batch_size, 1, "--batch-size"), (args.window, 1, "--window"),
                             (args.num_draft_tokens, 1, "--num-draft-tokens"),
                             (args.max_new_tokens, 0, "--max-new-tokens"), (args.show, 0, "--show")):
        _at_least(value, low, flag)
    _optional_at_least(args.limit, "--limit")
    _optional_at_least(args.per_category, "--per-category")
    try:
        SamplingConfig(args.do_sample, args.temperature, args.top_k, args.top_p)
        check_seed(args.seed)
    except ValueError as e:
        message = str(e)
        for name in ("temperature", "top_k", "top_p", "seed"):
            if message.startswith(name):
                message = "--" + name.replace("_", "-") + message[len(name):]
        raise ValueError(message) from None
    if args.check and args.do_sample:
        raise ValueError("--check compares with greedy decoding: drop --do-sample")
    autoregressive = args.scheduler == "autoregressive"
    if args.fixed_k and autoregressive:
        raise ValueError("--fixed-k fixes the drafts per step, and --scheduler autoregressive drafts none: drop one")
    if autoregressive and (args.draft or args.draft_dtype or args.drafter != "model"):
        raise ValueError("--scheduler autoregressive decodes without a drafter: drop --draft, --draft-dtype and "
                         "--drafter ngram / early-exit")
    check_drafter_flags(args.target, args.draft, args.drafter, args.draft_dtype, args.exit_layer)
    if args.target and not autoregressive and args.drafter == "model" and not (args.draft or args.draft_dtype):
        raise ValueError("--target needs a drafter: --draft DIR, --draft-dtype float16, or --drafter ngram "
                         "(or --scheduler autoregressive for plain decoding)")
    _check_prompts(args.prompts)
    device = check_device(args.device)
    _check_backend(args.backend, device)
    _check_tp(args, device)
    check_output(args.json_out, "--json")


def _check_tp(args, device: torch.device) -> None:
    _at_least(args.tp, 1, "--tp")
    if not args.tp_timeout > 0:
        raise ValueError(f"--tp-timeout must be > 0 seconds, got {args.tp_timeout}")
    if args.tp == 1:
        return
    if not args.target:
        raise ValueError("--tp shards a --target folder (the embedded pair is built in memory): give --target DIR")
    if args.draft_dtype:
        raise ValueError("--draft-dtype with --tp would put a whole copy of the sharded target on every rank: "
                         "give a smaller --draft DIR or --drafter ngram")
    if not distributed_available():
        raise ValueError("--tp needs torch.distributed, which this torch build lacks")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != args.tp:
        raise ValueError(f"--tp {args.tp} runs as {args.tp} processes, but this is {world}: launch it with "
                         f"`python -m torch.distributed.run --nproc-per-node {args.tp} -m specdec run ... "
                         f"--tp {args.tp}`")
    local = int(os.environ.get("LOCAL_WORLD_SIZE", args.tp))
    if device.type == "cuda" and torch.cuda.device_count() < local:
        raise ValueError(f"--tp {args.tp} --device cuda puts {local} ranks on this host, which has "
                         f"{torch.cuda.device_count()} GPU(s)")


def _check_real_demo(args) -> None:
    _optional_at_least(args.limit, "--limit")
    _at_least(args.per_category, 1, "--per-category")
    _at_least(args.max_new_tokens, 1, "--max-new-tokens")
    _at_least(args.repeats, 1, "--repeats")
    _at_least(args.num_draft_tokens, 1, "--num-draft-tokens")
    for size in args.batch_sizes:
        _at_least(size, 1, "--batch-sizes")
    check_model_folder(args.target, "--target")
    _check_prompts(args.prompts)
    check_output(args.json_out, "--json")


def _check_ablate(args) -> None:
    check_device(args.device)
    if args.max_new_tokens is not None:
        _at_least(args.max_new_tokens, 1, "--max-new-tokens")
    _optional_at_least(args.limit, "--limit")
    _at_least(args.num_draft_tokens, 1, "--num-draft-tokens")
    for size in args.batch_sizes or ():
        _at_least(size, 1, "--batch-sizes")
    check_drafter_flags(args.target, args.draft, args.drafter, args.draft_dtype, args.exit_layer)
    if args.draft_dtype and not args.target:
        raise ValueError("--draft-dtype needs --target (the embedded pair's draft is its layer-skip model)")
    _check_prompts(args.prompts)
    check_output(args.json_out, "--json")
    check_output(args.plot, "--plot")


def _at_least(value: int, low: int, flag: str) -> None:
    if value < low:
        raise ValueError(f"{flag} must be >= {low}, got {value}")


def _optional_at_least(value: int | None, flag: str) -> None:
    if value is not None:
        _at_least(value, 1, flag)


def check_device(name: str) -> torch.device:
    """The torch.device for --device, refused unless it exists here and holds data (not meta)."""
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError, TypeError):
        raise ValueError(f"--device {name!r} is not a device name (cpu, cuda, cuda:1, ...)") from None
    if device.type == "cpu":
        return device
    if device.type == "meta":
        raise ValueError("--device meta holds no data (meta tensors have shapes but no storage), so nothing can "
                         "be decoded there; use --device cpu or cuda")
    backend = getattr(torch, device.type, None)
    is_available = getattr(backend, "is_available", None)
    if not callable(is_available) or not is_available():
        extra = f" (this torch {torch.__version__} has CUDA {torch.version.cuda})" if device.type == "cuda" else ""
        raise ValueError(f"--device {name}: {device.type} is not available here{extra}; use --device cpu")
    count = getattr(backend, "device_count", None)
    if device.index is not None and callable(count) and device.index >= count():
        raise ValueError(f"--device {name}: there are only {count()} {device.type} device(s) here")
    return device


def _check_backend(name: str | None, device: torch.device) -> None:
    if name is None or name == "auto":
        return
    reason = sk.unavailable_reason(name, device)
    if reason:
        raise ValueError(f"--backend {name} cannot run on {device.type}: {reason}")


def check_output(path: str | None, flag: str) -> None:
    """Refuse an output path that cannot be written, now rather than after the run. Leaves nothing behind:
    an existing file is opened for appending (not changed), a new one is probed with a temporary file in the
    nearest folder that exists (the folders on the way are made when the file is written)."""
    if not path:
        return
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path!r} is a folder; give a file path")
    folder = os.path.dirname(os.path.abspath(path))
    existing = folder
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise ValueError(f"{flag} {path!r} cannot be written: {existing!r} is a file, not a folder")
    try:
        if os.path.exists(path):
            with open(path, "a"):
                pass
        else:
            with tempfile.TemporaryFile(dir=existing):
                pass
    except OSError as e:
        raise ValueError(f"{flag} {path!r} cannot be written ({e.strerror or e})") from None


def _check_prompts(path: str | None) -> None:
    if path is not None:
        load_prompts(path)


def _print_checks(checks: list[dict]) -> None:
    exact = sum(c["exact"] for c in checks)
    print(f"\nexact match with plain greedy decoding: {exact}/{len(checks)} prompts")
    for c in checks:
        if not c["exact"]:
            print(f"  prompt {c['prompt']}: first difference at new token {c['position']}; target top-2 logit gap "
                  f"there: {c['gap_plain']:.2e} (plain run), {c['gap_spec']:.2e} (speculative prefix) - "
                  + ("a near-tie: float rounding of different batch shapes" if max(c['gap_plain'], c['gap_spec'])
                     < 1e-3 else "a wide gap: a bug"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.command_line = "python -m specdec " + " ".join(shlex.quote(a) for a in argv)
    try:
        check_args(args)
        if args.command == "run":
            cmd_run(args)
        elif args.command == "demo":
            run_demo(threads=args.threads, backend=args.backend, json_out=args.json_out)
        elif args.command == "real-demo":
            run_real_demo(threads=args.threads, target_dir=args.target, prompts=args.prompts,
                          per_category=args.per_category, limit=args.limit, max_new_tokens=args.max_new_tokens,
                          batch_sizes=args.batch_sizes, repeats=args.repeats, k=args.num_draft_tokens,
                          drafters=args.drafters, fixed=not args.no_fixed, transformers=args.transformers,
                          check=not args.no_check, chat=not args.no_chat_template, json_out=args.json_out,
                          command=args.command_line, model=args.model, clock=args.clock,
                          block=None if args.whole_cell else 0)
        else:
            run_ablation(quick=args.quick, json_out=args.json_out, plot=args.plot, device=args.device,
                         threads=args.threads, prompts=args.prompts, max_new_tokens=args.max_new_tokens,
                         k=args.num_draft_tokens, batch_sizes=args.batch_sizes, limit=args.limit,
                         target_dir=args.target, draft_dir=args.draft, drafter=args.drafter,
                         draft_dtype=args.draft_dtype, chat=not args.no_chat_template, command=args.command_line,
                         exit_layer=args.exit_layer)
    except ValueError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    except TensorParallelError as e:  # a rank failed or hung: every rank ends with this
        print(f"specdec: error: {e}", file=sys.stderr)
        return 1
    finally:
        if args.command == "run" and args.tp > 1 and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
    return 0
