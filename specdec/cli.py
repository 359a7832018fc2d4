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

import torch

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
    """(target, draft model or drafter, tokenizer, description)."""
    from .ngram import NgramDrafter
    if args.target:
        from .hf_models import cheap_copy, check_tokenizers_match, load_causal_lm
        target, tokenizer = load_causal_lm(args.target, device=args.device)
        name = os.path.basename(os.path.normpath(args.target))
        if args.drafter == "ngram":
            return target, NgramDrafter(), tokenizer, f"{name} + n-gram drafter"
        if args.draft:
            draft, draft_tokenizer = load_causal_lm(args.draft, device=args.device)
            check_tokenizers_match(tokenizer, draft_tokenizer)
            return target, draft, tokenizer, f"{name} + {os.path.basename(os.path.normpath(args.draft))}"
        if args.draft_dtype:
            return target, cheap_copy(target, DTYPES[args.draft_dtype]), tokenizer, f"{name} + {args.draft_dtype} copy"
        raise ValueError("--target needs a drafter: --draft DIR, --draft-dtype float16, or --drafter ngram")
    from .demo_models import build_default_pair
    target, draft, tokenizer = build_default_pair()
    target, draft = target.to(args.device), draft.to(args.device)
    if args.drafter == "ngram":
        return target, NgramDrafter(), tokenizer, "embedded 8-layer Llama + n-gram drafter"
    if args.draft_dtype:
        draft = draft.to(DTYPES[args.draft_dtype])
    return target, draft, tokenizer, "embedded 8-layer Llama + its 2-layer layer-skip draft"


def encode(tokenizer, texts: list[str], chat: bool) -> list[list[int]]:
    if chat and getattr(tokenizer, "chat_template", None):
        return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)) for t in texts]
    return [list(tokenizer.encode(t)) for t in texts]


def cmd_run(args) -> dict:
    from .check import check_against_greedy
    from .engine import SpeculativeDecoder
    from .prompts import load_prompts
    torch.set_num_threads(args.threads)
    target, draft, tokenizer, description = load_models(args)
    ids = encode(tokenizer, load_prompts(args.prompts, args.limit), not args.no_chat_template)
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
        if args.do_sample:
            raise ValueError("--check compares with greedy decoding: drop --do-sample")
        checks = check_against_greedy(target, ids, result.sequences, args.max_new_tokens, result.stats.get("eos"))
        summary["exact"] = sum(c["exact"] for c in checks) / len(checks)
    print(format_runs([summary]))
    for i, seq in enumerate(result.sequences[:args.show]):
        print(f"\n[{i}] {tokenizer.decode(seq, skip_special_tokens=True)!r}")
    if checks is not None:
        _print_checks(checks)
    if args.json_out:
        os.makedirs(os.path.dirname(args.json_out) or ".", exist_ok=True)
        with open(args.json_out, "w") as f:
            json.dump({"summary": summary, "checks": checks, "sequences": result.sequences}, f, indent=1)
    return summary


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
        if args.command == "run":
            cmd_run(args)
        elif args.command == "demo":
            from .demo import run_demo
            run_demo(threads=args.threads, backend=args.backend, json_out=args.json_out)
        elif args.command == "real-demo":
            from .real_demo import run_real_demo
            run_real_demo(threads=args.threads, limit=args.limit, max_new_tokens=args.max_new_tokens,
                          prompts=args.prompts, json_out=args.json_out)
        else:
            from .ablation import run_ablation
            run_ablation(quick=args.quick, json_out=args.json_out, plot=args.plot, device=args.device,
                         threads=args.threads, prompts=args.prompts, max_new_tokens=args.max_new_tokens)
    except ValueError as e:
        print(f"specdec: error: {e}", file=sys.stderr)
        return 2
    return 0
