"""EarlyExitDrafter judges plain steps: the first draft it would have made, read off the target's own forward,
against the token the target chose (EarlyExitDrafter.watch_plain). The verdicts must be what verification would
have said, and judging must leave the output and the target alone."""

import importlib.util
import os

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from engine_models import SPEC_SCHEDULERS, decoder, prompts
from specdec.drafting import EarlyExitDrafter, early_exit_view
from specdec.drafting import early_exit
from specdec.drafting.model import confidence_bin
from specdec.models import tiny_model

from test_early_exit import LENGTHS, deep_target, late_layers_silent, reference


def gemma3_softcapped(seed: int = 8):
    # Gemma's final logit softcap is applied by its causal-LM forward, after the head: the exit must apply it too
    config = Gemma3TextConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                              initializer_range=0.3, query_pre_attn_scalar=16, tie_word_embeddings=False,
                              layer_types=["full_attention"] * 3, final_logit_softcapping=3.0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Gemma3ForCausalLM(config).float().eval()


MODELS = {
    "llama-4-exit-2": lambda: deep_target("llama"),
    "qwen2-4-exit-2": lambda: deep_target("qwen2"),
    "gpt2-4-exit-2": lambda: deep_target("gpt2"),
    "mistral-4-exit-2": lambda: tiny_model("mistral", vocab_size=256, hidden_size=64, num_layers=4, seed=5),
    "gemma3-softcap-3-exit-2": gemma3_softcapped,
}


@pytest.mark.parametrize("name", list(MODELS))
@torch.no_grad()
def test_the_exit_head_gives_the_views_logits(name):
    model = MODELS[name]()
    ids = torch.randint(0, 256, (3, 11), generator=torch.Generator().manual_seed(4))
    layer = early_exit._decoder_stack(model)[2][1]
    captured = []
    handle = layer.register_forward_hook(lambda m, a, out: captured.append(out[0] if isinstance(out, tuple) else out))
    try:
        model(ids)
    finally:
        handle.remove()
    norm, head, cap = early_exit.exit_head(model)
    got = head(norm(captured[0][:, -1]))
    if cap:
        got = torch.tanh(got / cap) * cap
    want = early_exit_view(model, 2)(ids).logits[:, -1]
    assert (cap is not None) == name.startswith("gemma3")
    # float32's own tolerance: the head runs over one column here, over all of them in the view (other shapes of
    # matrix product round differently); a missing norm, head or softcap is off by far more
    torch.testing.assert_close(got, want)


def judging_run(model, scheduler, batch_size, seed=70, max_new=20):
    """A run whose steps are scripted (a third plain), judging every plain step; (result, judged verdicts as
    (prefix, emitted token, key, matched), the drafter)."""
    drafter = EarlyExitDrafter(model, 2, judge_share=1.0)  # every plain step: its cost is not what is tested here
    seen = []
    judge = drafter._judge

    def recorded(batch, emitted):
        before = len(drafter._judged)
        judge(batch, emitted)
        rows = {s: (tuple(batch.history(s)), out[0]) for s, out in zip(batch.seqs, emitted)}
        for seq, keys, matched in drafter._judged[before:]:
            seen.append(rows[seq] + (keys, matched))

    drafter._judge = recorded
    dec = decoder(model, drafter, scheduler, window=4, num_draft_tokens=3, control="scripted")
    ps = prompts(LENGTHS, seed)
    res = dec.generate(ps, max_new_tokens=max_new, batch_size=batch_size, eos_token_id=[])
    assert res.sequences == reference(model, ps, max_new)
    return res, seen, drafter


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
@pytest.mark.parametrize("family,batch_size", [("llama", 3), ("gpt2", 1)], ids=["llama-b3", "gpt2-b1"])
@torch.no_grad()
def test_plain_steps_are_judged_as_verification_would(family, batch_size, scheduler):
    model = deep_target(family)
    res, seen, _ = judging_run(model, scheduler, batch_size)
    assert res.stats["plain_steps"] > 0 and len(seen) >= res.stats["plain_steps"]
    assert res.stats["judged_drafts"] == len(seen)
    view = early_exit_view(model, 2)
    matched = 0
    for prefix, token, keys, hit in seen:
        logits = view(torch.tensor([prefix])).logits[0, -1]
        draft = int(logits.argmax())
        assert keys == [("model", 1, confidence_bin(float(logits.softmax(-1)[draft])))]
        assert hit == int(token == draft)
        matched += hit
    assert 0 < matched < len(seen)  # both verdicts occur: the comparison above could fail either way


@pytest.mark.parametrize("scheduler", SPEC_SCHEDULERS)
def test_an_exit_that_is_the_target_is_judged_right_every_time(scheduler):
    res, seen, _ = judging_run(late_layers_silent(deep_target("llama"), 2), scheduler, 3)
    assert seen and all(hit == 1 for *_, hit in seen)
    assert res.stats["acceptance_rate"] == 1.0


@pytest.mark.parametrize("case", ["sampling", "fixed-k", "judge-plain-off"])
def test_nothing_is_judged_where_it_would_not_be_a_verdict(case):
    # sampled drafts are not deterministic (a match is not an acceptance); fixed K has no plain steps and learns
    # nothing; and judging can be switched off. No hook may stay on the target either way.
    torch.manual_seed(0)
    model = deep_target("llama")
    drafter = EarlyExitDrafter(model, 2, judge_plain=case != "judge-plain-off")
    control = "fixed" if case == "fixed-k" else "scripted"
    dec = decoder(model, drafter, "eqspec", num_draft_tokens=3, control=control)
    sampling = {"do_sample": True, "temperature": 0.8} if case == "sampling" else {}
    res = dec.generate(prompts(LENGTHS, 71), max_new_tokens=12, batch_size=3, eos_token_id=[], **sampling)
    assert res.stats["judged_drafts"] == 0
    assert all(not layer._forward_hooks for layer in early_exit._decoder_stack(model)[2])


@torch.no_grad()
def test_one_plain_step_in_judge_every_is_judged(monkeypatch):
    model = deep_target("llama")
    drafter = EarlyExitDrafter(model, 2)
    monkeypatch.setattr(early_exit, "JUDGE_FOLLOW", 0.0)  # the share stays where it is set
    drafter._cost_share = 3.5 * drafter.judge_share
    assert drafter.judge_every == 4
    watched = []
    watch = drafter.watch_plain
    drafter.watch_plain = lambda batch, sampling: (watched.append(batch.size), watch(batch, sampling))
    dec = decoder(model, drafter, "eqspec", num_draft_tokens=3, control="scripted")
    res = dec.generate(prompts(LENGTHS, 72), max_new_tokens=30, batch_size=1, eos_token_id=[])
    assert len(watched) == res.stats["plain_steps"] >= 8
    assert res.stats["judged_drafts"] == len(range(0, len(watched), 4))
    assert not any(layer._forward_hooks for layer in early_exit._decoder_stack(model)[2])


def test_judging_follows_its_measured_cost():
    # the share starts at the head's share of the weights and moves towards what judged steps measure
    model = deep_target("llama")
    drafter = EarlyExitDrafter(model, 2)
    prior = drafter._cost_share
    assert prior == pytest.approx(early_exit.head_share(model))
    dec = decoder(model, drafter, "eqspec", num_draft_tokens=3, control="scripted")
    res = dec.generate(prompts(LENGTHS, 73), max_new_tokens=20, batch_size=3, eos_token_id=[])
    assert res.stats["judged_drafts"] > 0 and drafter._cost_share != prior


def _first_calls():
    path = os.path.join(os.path.dirname(__file__), "..", "bench", "first_calls.py")
    spec = importlib.util.spec_from_file_location("first_calls", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_first_calls_bench_runs_every_decoder_exactly():
    bench = _first_calls()
    torch.manual_seed(0)
    rows = bench.measure(deep_target("llama"), prompts((5, 9, 3), 74), 2, trials=2, calls=2, max_new=6,
                         shares=(0.5, 0.01))
    assert len(rows) == 2
    for by_name in rows:
        assert list(by_name) == ["judging 0.5", "judging 0.01", "not judging", "fixed K"]
        for name, r in by_name.items():
            assert len(r["speedups"]) == 2 and all(x > 0 for x in r["speedups"]), name
            assert r["mean_width"] >= 1.0
        assert by_name["fixed K"]["mean_width"] > 1.0 and by_name["fixed K"]["plain_steps"] == 0
    with pytest.raises(ValueError, match="trials and calls must be >= 1, got 0 and 2"):
        bench.measure(deep_target("llama"), [[3, 4]], 1, trials=0, calls=2, max_new=2)


@pytest.mark.parametrize("share", [0, -0.1, 1.5, True, "1%"], ids=["zero", "negative", "above-1", "bool", "text"])
def test_a_bad_judge_share_is_named(share):
    with pytest.raises(ValueError, match=r"judge_share must be a share of plain decoding in \(0, 1\], got "):
        EarlyExitDrafter(deep_target("llama"), 2, judge_share=share)
