"""The embedded default for `python -m specdec run` / `make demo`: a target/draft pair that needs no download.

Target: an 8-layer Llama (hidden 256, 4 heads, 2 KV heads, byte vocabulary) with random weights from a fixed
seed. Random layers of equal strength make every layer rewrite the prediction, so no cheap draft could agree
with it. We scale the output projections (attention o_proj and MLP down_proj) of layers 3-8 by
LATE_LAYER_SCALE = 0.1, so those layers refine the residual stream rather than replace it, roughly as the late
layers of a trained network do.
Draft: the target's own first 2 layers with its embeddings, final norm and head (a layer-skip, self-speculative
draft): about a quarter of the target's cost. Its greedy choice agrees with the target's on roughly three of
four positions, and that agreement is what sets the acceptance rate. build_default_pair returns it as a model of
its own (a copy of those weights, with a KV cache of its own in the engine); `EarlyExitDrafter(target,
DRAFT_LAYERS)` (specdec.drafting.early_exit) runs the same layers over the target's own cache instead. The text
itself is meaningless (random weights over bytes); the point is timing, acceptance and exactness.
"""

from __future__ import annotations

import json
from importlib import resources

import torch
from transformers import LlamaConfig, LlamaForCausalLM

LATE_LAYER_SCALE = 0.1
DRAFT_LAYERS = 2


class ByteTokenizer:
    """UTF-8 bytes as token ids 0..255, plus BOS/EOS/PAD; enough to feed text prompts to the demo models."""

    bos_token_id, eos_token_id, pad_token_id = 256, 257, 258
    vocab_size = 260

    def encode(self, text: str) -> list[int]:
        return [self.bos_token_id] + list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def __call__(self, text: str):
        return {"input_ids": self.encode(text)}


def _config(layers: int) -> LlamaConfig:
    tok = ByteTokenizer
    return LlamaConfig(vocab_size=tok.vocab_size, hidden_size=256, intermediate_size=688, num_hidden_layers=layers,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                       initializer_range=0.3, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
                       eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def build_default_pair(seed: int = 0, layers: int = 8, dtype=torch.float32):
    """(target, draft, tokenizer), deterministic for a seed; see the module docstring."""
    torch.manual_seed(seed)
    target = LlamaForCausalLM(_config(layers))
    with torch.no_grad():
        for layer in target.model.layers[DRAFT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(LATE_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LATE_LAYER_SCALE)
    draft = LlamaForCausalLM(_config(DRAFT_LAYERS))
    shared = {k: v for k, v in target.state_dict().items()
              if not k.startswith("model.layers.") or int(k.split(".")[2]) < DRAFT_LAYERS}
    draft.load_state_dict(shared)
    for model in (target, draft):
        model.generation_config.eos_token_id = None  # random weights: stop on length, not on a stray EOS byte
        model.generation_config.pad_token_id = ByteTokenizer.pad_token_id
    return target.to(dtype).eval(), draft.to(dtype).eval(), ByteTokenizer()


def shipped_prompts() -> list[dict]:
    """The English, code and math prompts that ship with the package (specdec/data/prompts.jsonl)."""
    text = resources.files("specdec").joinpath("data/prompts.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
