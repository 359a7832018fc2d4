"""Tiny offline causal LMs built from configs with a fixed seed, for tests, demos and benchmarks.

No model hub is needed. Weights are drawn with a large initializer_range (0.3 by default) so the logits are
peaked: argmax ties, and argmax flips from float rounding differences between a batched and a single-prompt
forward, do not happen, which is what makes token-for-token greedy equivalence a meaningful test.
"""

from __future__ import annotations

import copy

import torch
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM)

from ..kv.geometry import max_positions

# mistral: Llama's architecture with Mistral's sliding_window (None here unless config_overrides set one)
FAMILIES = ("llama", "qwen2", "gpt2", "mistral")


def _config(family: str, vocab_size: int, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
            max_positions: int, initializer_range: float, overrides: dict | None = None):
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {FAMILIES}, got {family!r}")
    if family == "gpt2":
        cls, kwargs = GPT2Config, dict(vocab_size=vocab_size, n_embd=hidden_size, n_layer=num_layers, n_head=num_heads,
                                       n_positions=max_positions, initializer_range=initializer_range,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=None,
                                       eos_token_id=None)
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[family]
        kwargs = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
                      max_position_embeddings=max_positions, initializer_range=initializer_range,
                      tie_word_embeddings=False)
        kwargs.update({"qwen2": {"use_sliding_window": False}, "mistral": {"sliding_window": None}}.get(family, {}))
    # overrides go to the config class itself, so that what it derives from them (Qwen2's layer_types) follows
    return cls(**{**kwargs, **(overrides or {})})


def tiny_model(family: str = "llama", *, vocab_size: int = 256, hidden_size: int = 64, num_layers: int = 2,
               num_heads: int = 4, num_kv_heads: int | None = None, max_positions: int = 512,
               initializer_range: float = 0.3, seed: int = 0,
               config_overrides: dict | None = None) -> PreTrainedModel:
    """A float32 causal LM in eval mode with deterministic weights (a function of all arguments).

    config_overrides: more config arguments, e.g. Qwen2's use_sliding_window, sliding_window, max_window_layers.
    The generation config has no EOS/BOS/pad ids, so `model.generate` stops only where told to.
    """
    num_kv_heads = num_kv_heads if num_kv_heads is not None else max(1, num_heads // 2)
    config = _config(family, vocab_size, hidden_size, num_layers, num_heads, num_kv_heads, max_positions,
                     initializer_range, config_overrides)
    config.bos_token_id = config.eos_token_id = config.pad_token_id = None
    cls = {"llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM, "gpt2": GPT2LMHeadModel,
           "mistral": MistralForCausalLM}[family]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls(config)
    model = model.float().eval()
    gen = model.generation_config
    gen.bos_token_id = gen.eos_token_id = gen.pad_token_id = None
    return model


def noisy_copy(model: PreTrainedModel, noise: float = 0.02, seed: int = 1) -> PreTrainedModel:
    """A draft that agrees with `model` often but not always: the same weights plus Gaussian noise of relative
    size `noise` (relative to each tensor's standard deviation)."""
    return _add_noise(copy.deepcopy(model), noise, seed)


def _add_noise(draft: PreTrainedModel, noise: float, seed: int) -> PreTrainedModel:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            scale = p.float().std() if p.numel() > 1 else p.abs().float()
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * noise * scale)
    return draft.eval()


def agreeing_draft(target: PreTrainedModel, noise: float = 0.02, seed: int = 1) -> PreTrainedModel:
    """A draft of ANOTHER family that agrees with the target often: Llama and Qwen2 share their architecture up
    to Qwen2's q/k/v biases, so the target's weights move across (biases zero) and get a little noise. GPT-2 has
    no architectural twin here, so a GPT-2 target gets a noisy GPT-2 copy."""
    family = model_family(target)
    if family not in ("llama", "qwen2"):
        return noisy_copy(target, noise, seed)
    other = "qwen2" if family == "llama" else "llama"
    c = target.config
    draft = tiny_model(other, vocab_size=c.vocab_size, hidden_size=c.hidden_size, num_layers=c.num_hidden_layers,
                       num_heads=c.num_attention_heads, num_kv_heads=c.num_key_value_heads,
                       max_positions=c.max_position_embeddings, seed=seed)
    state = {k: v for k, v in target.state_dict().items() if not k.endswith(("q_proj.bias", "k_proj.bias",
                                                                                "v_proj.bias"))}
    missing, unexpected = draft.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("bias") for k in missing):
        raise RuntimeError(f"weights do not carry over: missing {missing}, unexpected {unexpected}")
    with torch.no_grad():
        for name in missing:
            draft.get_parameter(name).zero_()
    return _add_noise(draft, noise, seed)


def model_family(model: PreTrainedModel) -> str:
    return model.config.model_type


def unrelated_draft(target: PreTrainedModel, family: str | None = None, *, num_layers: int = 1,
                    hidden_size: int = 64, seed: int = 7, **kwargs) -> PreTrainedModel:
    """A draft of another family (by default) with the target's vocabulary and random, unrelated weights."""
    if family is None:
        own = model_family(target)
        family = next(f for f in FAMILIES if f != own)
    vocab = target.get_output_embeddings().weight.shape[0]
    return tiny_model(family, vocab_size=vocab, hidden_size=hidden_size, num_layers=num_layers, seed=seed,
                      max_positions=kwargs.pop("max_positions", max_positions(target)), **kwargs)
