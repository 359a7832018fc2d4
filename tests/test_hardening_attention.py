"""Attention the engine must reproduce: sliding-window models (Mistral's `sliding_window`, Qwen2's
`use_sliding_window` + `max_window_layers`, `layer_types`) decode exactly on every path (target and draft, model
drafter, n-gram drafter, autoregressive, EQSPEC, EXSPEC), because the engine builds their windowed masks itself;
what it cannot build (per-layer windows of other sizes, local layers, other layer types, attention
implementations that ignore a custom 4-D mask) is refused in SpeculativeDecoder.__init__, before any forward.
"""

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

from engine_models import SPEC_SCHEDULERS, decoder
from specdec import SpeculativeDecoder
from specdec.drafting import ModelDrafter
from specdec.models import tiny_model
from specdec.drafting.early_exit import EarlyExitDrafter
from specdec.drafting.ngram import NgramDrafter
from specdec.validation import attention_support

V = 64


def mistral(window=4, seed=3, **overrides):
    config = MistralConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                           initializer_range=0.3, tie_word_embeddings=False, sliding_window=window, **overrides)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MistralForCausalLM(config).float().eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


def qwen2_sliding(seed=4, sliding=True):
    # layer 0 full, layer 1 a window of 4: Qwen2's own way of mixing them
    return tiny_model("qwen2", vocab_size=V, max_positions=256, seed=seed,
                      config_overrides={"use_sliding_window": sliding, "sliding_window": 4, "max_window_layers": 1})


def full(seed=5):
    return tiny_model("llama", vocab_size=V, max_positions=256, seed=seed)


def gemma3(seed=6, sliding=True):
    # Gemma 3's hybrid: sliding layers of window 4 around a full one, as its config lists them
    types = ["sliding_attention", "full_attention", "sliding_attention"] if sliding else ["full_attention"] * 3
    config = Gemma3TextConfig(vocab_size=V, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                              initializer_range=0.3, sliding_window=4, layer_types=types, query_pre_attn_scalar=16,
                              tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Gemma3ForCausalLM(config).float().eval()
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = None
    return model


SLIDING = {"mistral-window-4": mistral, "qwen2-sliding-layers": qwen2_sliding, "gemma3-hybrid": gemma3}
# the same weights with full attention
WITHOUT_WINDOW = {"mistral-window-4": lambda: mistral(None),
                  "qwen2-sliding-layers": lambda: qwen2_sliding(sliding=False),
                  "gemma3-hybrid": lambda: gemma3(sliding=False)}


@pytest.mark.parametrize("name", SLIDING)
def test_sliding_models_really_slide(name):
    """The premise: on a prompt longer than the window these models' greedy output is not that of the same
    weights with full attention, so an engine building full causal masks would decode something else."""
    prompt = torch.tensor([list(range(1, 13))])
    windowed, plain = SLIDING[name](), WITHOUT_WINDOW[name]()
    assert all(torch.equal(a, b) for a, b in zip(windowed.state_dict().values(), plain.state_dict().values()))
    assert attention_support(plain) is None and attention_support(windowed) is None
    assert not torch.equal(windowed.generate(prompt, do_sample=False, max_new_tokens=8),
                           plain.generate(prompt, do_sample=False, max_new_tokens=8))


def _paths():
    """(id, target, draft or drafter, scheduler) for every path, with the sliding model as target or draft."""
    out = []
    for name, make in SLIDING.items():
        out.append((f"{name}-target-autoregressive", make, None, "autoregressive"))
        for scheduler in SPEC_SCHEDULERS:
            out.append((f"{name}-target-model-draft-{scheduler}", make, full, scheduler))
            out.append((f"{name}-target-ngram-{scheduler}", make, "ngram", scheduler))
            out.append((f"{name}-target-itself-as-draft-{scheduler}", make, make, scheduler))
            out.append((f"{name}-draft-{scheduler}", full, make, scheduler))
            out.append((f"{name}-in-a-ModelDrafter-{scheduler}", full, ("drafter", make), scheduler))
            out.append((f"{name}-target-early-exit-{scheduler}", make, ("early-exit", 1), scheduler))
    return out


@pytest.mark.parametrize("realign", ["shift", "mask"])
@pytest.mark.parametrize("make_target,make_draft,scheduler", [pytest.param(*p[1:], id=p[0]) for p in _paths()])
def test_sliding_window_exact_on_every_path(make_target, make_draft, scheduler, realign):
    # Prompts longer and shorter than the window of 4, ragged batches with refills: the windowed masks count
    # real tokens only, so padding and realignment holes never use up a window.
    target = make_target()
    if make_draft is None:
        draft = None
    elif make_draft == "ngram":
        draft = NgramDrafter()
    elif isinstance(make_draft, tuple) and make_draft[0] == "early-exit":
        draft = EarlyExitDrafter(target, make_draft[1])
    elif isinstance(make_draft, tuple):
        draft = ModelDrafter(make_draft[1]())
    else:
        draft = make_draft()
    g = torch.Generator().manual_seed(9)
    ps = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 17, 9, 1, 30, 6)]
    want = [target.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            do_sample=False, max_new_tokens=16)[0, len(p):].tolist() for p in ps]
    dec = SpeculativeDecoder(target, draft, scheduler=scheduler, num_draft_tokens=3, realign=realign,
                             adaptive=False, window=4)
    res = dec.generate(ps, max_new_tokens=16, batch_size=3, eos_token_id=[])
    assert res.sequences == want
    if make_draft is make_target:  # the draft's own windowed cache is right too: it agrees everywhere
        assert res.stats["acceptance_rate"] == 1.0


@pytest.mark.parametrize("impl", ["flash_attention_2", "flex_attention"])
def test_attention_implementations_that_ignore_a_4d_mask_are_refused(impl):
    model = full()
    model.config._attn_implementation_internal = impl  # what loading with attn_implementation=impl records
    assert model.config._attn_implementation == impl
    reason = attention_support(model)
    assert reason is not None and impl in reason and "sdpa" in reason
    with pytest.raises(ValueError, match=impl):
        SpeculativeDecoder(model, None, scheduler="autoregressive")
    with pytest.raises(ValueError, match=impl):
        SpeculativeDecoder(full(), model)


def test_sdpa_and_eager_full_attention_models_are_supported():
    for impl in ("sdpa", "eager"):
        model = full()
        model.config._attn_implementation_internal = impl
        assert attention_support(model) is None
    for family in ("llama", "qwen2", "gpt2"):
        assert attention_support(tiny_model(family, vocab_size=V)) is None


def test_config_forms_of_sliding_attention():
    """Each way a config says "this layer only sees a window" is caught, and nothing else is."""
    # Qwen2: use_sliding_window=True but every layer below max_window_layers: no layer slides
    assert attention_support(tiny_model("qwen2", vocab_size=V, config_overrides={
        "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 2})) is None
    # Qwen2: the flag off, the window ignored
    assert attention_support(tiny_model("qwen2", vocab_size=V, config_overrides={
        "use_sliding_window": False, "sliding_window": 4, "max_window_layers": 0})) is None
    # the forms the engine builds: layer_types of full and sliding layers, and Mistral's every-layer window
    assert attention_support(qwen2_sliding()) is None
    assert attention_support(mistral(4)) is None and attention_support(mistral(255)) is None
    assert attention_support(mistral(None)) is None and attention_support(mistral(256)) is None
    # a Qwen2-style config without layer_types: max_window_layers says which layers slide
    model = full()
    model.config.layer_types = None
    model.config.update({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1})
    assert "1 of 2 layers" in attention_support(model) and "max_window_layers=1" in attention_support(model)
    model.config.max_window_layers = 2
    assert attention_support(model) is None
    # layer_types naming any other kind of layer
    model = full()
    model.config.layer_types = ["full_attention", "chunked_attention"]
    assert "chunked_attention" in attention_support(model)
    # per-layer windows as a list
    model = full()
    model.config.sliding_window = [None, 8]
    assert "per-layer sliding windows" in attention_support(model)
    # GPT-Neo-style local layers
    model = full()
    model.config.attention_layers = ["global", "local"]
    model.config.window_size = 16
    assert "local" in attention_support(model)
    # a window only the layers know about
    model = full()
    model.model.layers[1].self_attn.sliding_window = 8
    assert "sliding_window=8" in attention_support(model)


def test_supported_models_still_decode():
    # the refusal must not catch what works: a Mistral without a window decodes exactly
    model = mistral(None)
    prompt = [list(range(1, 13))]
    want = model.generate(torch.tensor(prompt), do_sample=False, max_new_tokens=10)[0, 12:].tolist()
    for scheduler, draft in (("autoregressive", None), ("eqspec", NgramDrafter()), ("exspec", full())):
        got = SpeculativeDecoder(model, draft, scheduler=scheduler).generate(prompt, max_new_tokens=10,
                                                                             eos_token_id=[])
        assert got.sequences == [want], scheduler


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("name", SLIDING)
def test_sliding_draft_that_skips_steps_catches_up_exactly(name, scheduler):
    # A scripted controller makes the draft sit steps out and catch up on them in one ragged forward: its
    # windowed masks over the caught-up columns must still be exactly the model's (a self-draft agrees always).
    model = SLIDING[name]()
    g = torch.Generator().manual_seed(10)
    ps = [torch.randint(0, V, (n,), generator=g).tolist() for n in (5, 22, 2, 13)]
    want = [model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                           do_sample=False, max_new_tokens=24)[0, len(p):].tolist() for p in ps]
    dec = decoder(model, model, scheduler, window=3, control="scripted", num_draft_tokens=4)
    res = dec.generate(ps, max_new_tokens=24, batch_size=2, eos_token_id=[])
    assert res.sequences == want
    assert res.stats["acceptance_rate"] == 1.0 and res.stats["resumed_columns"] > 0


def _masks_seen(model):
    seen = []
    model.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs.get("attention_mask")),
                                    with_kwargs=True)
    return seen


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_a_window_without_padding_or_holes_lets_transformers_build_the_causal_mask(impl):
    from specdec.kv.ragged import RaggedKV
    model = full()
    model.set_attn_implementation(impl)
    seen = _masks_seen(model)
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, V, (1, 9), generator=g)
    steps = torch.randint(0, V, (1, 6), generator=g)
    lane, logits = RaggedKV.prefill(model, [prompt[0].tolist()], 8)
    with torch.no_grad():
        step_logits = [logits[:, -1]] + [lane.forward(steps[:, i:i + 1])[:, -1] for i in range(3)]
        step_logits.append(lane.forward(steps[:, 3:6])[:, -1])  # a verification-shaped block of 3
        reference = model(torch.cat([prompt, steps], dim=1)).logits[0]
    assert seen[:5] == [None] * 5  # batch 1: no padding, no holes: no mask of ours
    for got, at in zip(step_logits, (8, 9, 10, 11, 14)):
        torch.testing.assert_close(got[0], reference[at], rtol=1e-5, atol=1e-5)


def test_padding_holes_and_sliding_windows_keep_the_engines_own_mask():
    from specdec.kv.ragged import RaggedKV
    model = full()
    seen = _masks_seen(model)
    lane, _ = RaggedKV.prefill(model, [[1, 2, 3], [4, 5]], 8)  # rows of two lengths: padding
    lane.forward(torch.tensor([[6], [7]]))
    assert all(m is not None for m in seen)
    seen.clear()
    lane, _ = RaggedKV.prefill(model, [[1, 2, 3], [4, 5, 6]], 8, realign="mask")
    lane.forward(torch.tensor([[6, 7], [8, 9]]))
    lane.drop_and_align([1, 0])  # row 0 keeps a hole where its dropped column was
    lane.forward(torch.tensor([[1], [2]]))
    assert seen[0] is None and seen[1] is None and seen[2] is not None
    sliding = mistral()
    seen = _masks_seen(sliding)
    lane, _ = RaggedKV.prefill(sliding, [[1, 2, 3]], 8)
    lane.forward(torch.tensor([[4]]))
    assert all(m is not None for m in seen)


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_gemma3_early_exit_that_is_the_target_accepts_everything(scheduler):
    # The early exit reads the target's own lane under its windowed masks (a sliding and a full layer here):
    # with the third layer silenced (its output projections zeroed, so its post-norms pass zeros) the exit at 2
    # computes what the target does, and must have every draft accepted.
    target = gemma3()
    with torch.no_grad():
        target.model.layers[2].self_attn.o_proj.weight.zero_()
        target.model.layers[2].mlp.down_proj.weight.zero_()
    g = torch.Generator().manual_seed(10)
    ps = [torch.randint(0, V, (n,), generator=g).tolist() for n in (3, 17, 9, 1, 30, 6)]
    want = [target.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                            do_sample=False, max_new_tokens=16)[0, len(p):].tolist() for p in ps]
    dec = SpeculativeDecoder(target, EarlyExitDrafter(target, 2), scheduler=scheduler, num_draft_tokens=3,
                             adaptive=False, window=4)
    res = dec.generate(ps, max_new_tokens=16, batch_size=3, eos_token_id=[])
    assert res.sequences == want
    assert res.stats["acceptance_rate"] == 1.0
