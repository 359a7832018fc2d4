"""Tensor parallelism: a target sharded over 2 gloo processes by transformers' TP plan decodes exactly as the whole
model does, on every rank alike.

The tests start the processes themselves (tests/tp_worker.py, RANK/WORLD_SIZE set per process, no launcher): one
run decodes every case of the module (tiny Llama and Qwen3 targets saved to a tmp folder and loaded with
tp_plan="auto" in each process), and the tests below check what it wrote; two more runs make one rank fail, and
one runs the CLI under `python -m torch.distributed.run`. Single-process checks (the slab's heads, refusals) need
no processes.
"""

from __future__ import annotations

import json
import os
import socket
import pathlib
import subprocess
import sys
import time

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from engine_models import VOCAB, agreeing_draft, decoder, prompts, reference, target
from test_engine_sampling import chi_square_p, exact_joint
from specdec import NgramDrafter, SlabCache, SpeculativeDecoder
from specdec.models import noisy_copy, tiny_model
from specdec.scheduling.control import Plan, SpeculationController
from specdec.scheduling.distributed import TensorParallelError, TensorParallelRanks, check_placement

pytestmark = pytest.mark.skipif(not torch.distributed.is_available() or not torch.distributed.is_gloo_available(),
                                reason="torch.distributed with gloo is not available in this torch build")

HERE = pathlib.Path(__file__).resolve().parent
WORKER = HERE / "tp_worker.py"
WORLD = 2
MAX_NEW = 12
SMALL_V = 8
PROMPT = [3, 1, 4]
CHI_N, CHI_DEPTH = 3000, 2


def qwen3_target() -> torch.nn.Module:
    config = Qwen3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                         initializer_range=0.3, tie_word_embeddings=False, bos_token_id=None, eos_token_id=None,
                         pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(13)
        model = Qwen3ForCausalLM(config).float().eval()
    gen = model.generation_config
    gen.bos_token_id = gen.eos_token_id = gen.pad_token_id = None
    return model


def small_target():
    # 4 heads, 2 KV heads: one KV head per rank
    return tiny_model("llama", vocab_size=SMALL_V, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                      initializer_range=0.15, seed=101)


def small_draft():
    return tiny_model("gpt2", vocab_size=SMALL_V, hidden_size=32, num_layers=1, num_heads=2,
                      initializer_range=0.15, seed=202)


def case_prompts():
    ps = prompts((5, 11, 3), seed=41)
    return ps + [[7, 8, 9, 10, 7, 8, 9, 10, 7, 8]]  # a repetitive one, so n-gram drafts get accepted


GREEDY = []  # (name, target, drafter, scheduler, realign, control)
for fam in ("llama", "qwen3"):
    for drafter, scheduler, realign, control in (("model", "eqspec", "shift", "fixed"),
                                                 ("ngram", "eqspec", "mask", "fixed"),
                                                 ("model", "exspec", "shift", "fixed"),
                                                 ("ngram", "exspec", "mask", "fixed"),
                                                 ("model", "eqspec", "mask", "adaptive"),
                                                 ("model", "eqspec", "shift", "skewed"),
                                                 ("ngram", "exspec", "shift", "skewed"),
                                                 ("early-exit", "eqspec", "shift", "fixed"),
                                                 ("early-exit", "exspec", "mask", "skewed"),
                                                 (None, "autoregressive", "shift", "fixed")):
        GREEDY.append((f"{fam}-{scheduler}-{drafter or 'none'}-{realign}-{control}", fam, drafter, scheduler,
                       realign, control))

SAMPLED = {  # name: (scheduler, drafter, seed)
    "sample-eqspec-model": ("eqspec", "model", 7),
    "sample-exspec-model": ("exspec", "model", 7),
    "sample-eqspec-ngram": ("eqspec", "ngram", 7),
}
SAMPLING = {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.95}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(spec: dict, folder: pathlib.Path, timeout: float = 300) -> tuple[list[int], list[str], list[dict], float]:
    """Run tests/tp_worker.py as WORLD processes; (return codes, stderr texts, rank outputs, seconds)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec_path = folder / "spec.json"
    spec_path.write_text(json.dumps(spec))
    port = _free_port()
    procs, logs = [], []
    started = time.perf_counter()
    for rank in range(WORLD):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(WORLD),
                   LOCAL_WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        log = open(folder / f"stderr{rank}.txt", "w+")
        logs.append(log)
        procs.append(subprocess.Popen([sys.executable, str(WORKER), str(spec_path), str(folder)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT, cwd=str(HERE)))
    codes = []
    try:
        for p in procs:
            codes.append(p.wait(timeout=max(1.0, timeout - (time.perf_counter() - started))))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    seconds = time.perf_counter() - started
    texts = []
    for log in logs:
        log.seek(0)
        texts.append(log.read())
        log.close()
    outputs = []
    for rank in range(WORLD):
        path = folder / f"rank{rank}.json"
        outputs.append(json.loads(path.read_text()) if path.exists() else None)
    return codes, texts, outputs, seconds


def save(model, folder: pathlib.Path) -> str:
    model.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_models")
    llama, qwen3 = target("llama"), qwen3_target()
    folders = {
        "targets": {"llama": save(llama, root / "llama"), "qwen3": save(qwen3, root / "qwen3"),
                    "small": save(small_target(), root / "small")},
        "drafts": {"llama": save(agreeing_draft(llama), root / "llama-draft"),
                   "qwen3": save(noisy_copy(qwen3, 0.02, seed=5), root / "qwen3-draft"),
                   "small": save(small_draft(), root / "small-draft")},
    }
    return {"root": root, "folders": folders, "targets": {"llama": llama, "qwen3": qwen3}}


def _cases() -> list[dict]:
    ps = case_prompts()
    cases = []
    for name, fam, drafter, scheduler, realign, control in GREEDY:
        cases.append({"name": name, "target": fam, "draft": fam, "drafter": drafter, "scheduler": scheduler,
                      "realign": realign, "control": control, "prompts": ps, "max_new": MAX_NEW, "batch_size": 3,
                      "window": 4, "k": 3})
    for name, (scheduler, drafter, seed) in SAMPLED.items():
        cases.append({"name": name, "target": "llama", "draft": "llama", "drafter": drafter, "scheduler": scheduler,
                      "prompts": ps, "max_new": MAX_NEW, "batch_size": 3, "window": 4, "k": 3, "seed": seed,
                      "eos": [0], **SAMPLING})
    cases.append({"name": "sample-no-seed", "target": "llama", "draft": "llama", "drafter": "model",
                  "control": "adaptive", "prompts": ps, "max_new": MAX_NEW, "k": 3, "seed": None, **SAMPLING})
    cases.append({"name": "other-prompts-on-rank-1", "target": "llama", "drafter": None, "scheduler": "autoregressive",
                  "prompts": ps, "rank_prompts": {"1": ps[:-1] + [[1, 2, 3]]}, "max_new": MAX_NEW,
                  "expect_error": True})
    cases.append({"name": "chi-square", "target": "small", "draft": "small", "drafter": "model", "k": 2,
                  "prompts": [PROMPT] * CHI_N, "max_new": CHI_DEPTH, "batch_size": CHI_N, "do_sample": True,
                  "seed": 3})
    return cases


@pytest.fixture(scope="module")
def tp_run(models):
    codes, logs, outputs, seconds = launch({"timeout": 120, **models["folders"], "cases": _cases()},
                                           models["root"] / "run")
    assert codes == [0] * WORLD, "\n".join(log[-3000:] for log in logs)
    return {"outputs": outputs, "seconds": seconds}


def _both(tp_run, name):
    r0, r1 = (out["cases"][name] for out in tp_run["outputs"])
    return r0, r1


def _reference(models, fam, ps):
    if fam == "llama":
        return reference("llama", ps, MAX_NEW)
    model = models["targets"][fam]
    out = []
    with torch.no_grad():
        for p in ps:
            ids = torch.tensor([p])
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW)
            out.append(gen[0, len(p):].tolist())
    return out


# ------------------------------------------------------------------------------------------- greedy
@pytest.mark.parametrize("name,fam", [(g[0], g[1]) for g in GREEDY], ids=[g[0] for g in GREEDY])
def test_greedy_is_token_exact_with_generate_on_every_rank(tp_run, models, name, fam):
    r0, r1 = _both(tp_run, name)
    assert r0["sequences"] == r1["sequences"]
    assert r0["sequences"] == _reference(models, fam, case_prompts())


def test_each_rank_holds_its_local_kv_heads(tp_run):
    # 2 KV heads over 2 ranks: the layers write one head, and the slab holds one (else update() raises)
    for out in tp_run["outputs"]:
        assert out["local_kv_heads"] == {"llama": 1, "qwen3": 1, "small": 1}


def test_controller_decisions_are_shared(tp_run):
    # The skewed controller plans other widths and stops on each rank: only rank 0's are used, so both ranks
    # step alike (same widths) and the other rank's own choices were overridden at least once.
    for name in [g[0] for g in GREEDY if g[5] in ("skewed", "adaptive")]:
        r0, r1 = _both(tp_run, name)
        assert r0["stats"]["width_histogram"] == r1["stats"]["width_histogram"], name
        assert r0["stats"]["steps"] == r1["stats"]["steps"]
        if "skewed" in name:
            assert r1["stats"]["tensor_parallel"]["overrides"] > 0, name
            assert r0["stats"]["tensor_parallel"]["overrides"] == 0


def test_one_collective_per_step_of_the_loops_own(tp_run):
    for name, *_ in GREEDY:
        r0, r1 = _both(tp_run, name)
        tp, steps = r0["stats"]["tensor_parallel"], r0["stats"]["steps"]
        kinds = tp["collectives_by_kind"]
        assert kinds["tokens and accept counts"] == steps and kinds["seed and arguments"] == 1
        assert kinds["first tokens"] >= 1
        if "-fixed" in name:  # a fixed-K controller decides alone: nothing else per step
            assert set(kinds) == {"tokens and accept counts", "seed and arguments", "first tokens"}, kinds
        else:
            assert kinds["the plan"] == steps
        if "skewed" not in name:
            # the ranks' own tokens and counts equal rank 0's: TP logits are bitwise equal across ranks here
            assert r1["stats"]["tensor_parallel"]["disagreements"] == 0, name


# ------------------------------------------------------------------------------------------- sampling
@pytest.mark.parametrize("name", sorted(SAMPLED))
def test_same_seed_same_samples_on_every_rank_and_as_one_process(tp_run, models, name):
    r0, r1 = _both(tp_run, name)
    assert r0["sequences"] == r1["sequences"]
    scheduler, drafter, seed = SAMPLED[name]
    draft = agreeing_draft(models["targets"]["llama"]) if drafter == "model" else NgramDrafter()
    dec = decoder(models["targets"]["llama"], draft, scheduler, window=4, num_draft_tokens=3)
    single = dec.generate(case_prompts(), max_new_tokens=MAX_NEW, batch_size=3, eos_token_id=[0], seed=seed,
                          **SAMPLING)
    assert r0["sequences"] == single.sequences


def test_no_seed_still_one_seed_for_all_ranks(tp_run):
    r0, r1 = _both(tp_run, "sample-no-seed")
    assert r0["sequences"] == r1["sequences"]


def test_sampling_follows_the_target_distribution(tp_run):
    r0, r1 = _both(tp_run, "chi-square")
    assert r0["sequences"] == r1["sequences"]
    counts: dict = {}
    for s in r0["sequences"]:
        counts[tuple(s)] = counts.get(tuple(s), 0) + 1
    assert chi_square_p(counts, exact_joint(small_target(), CHI_DEPTH, 1.0, 0, 1.0), CHI_N) > 1e-3
    # the test has power: the draft's own distribution is rejected on the same samples
    assert chi_square_p(counts, exact_joint(small_draft(), CHI_DEPTH, 1.0, 0, 1.0), CHI_N) < 1e-6


def test_ranks_given_different_calls_all_refuse(tp_run):
    r0, r1 = _both(tp_run, "other-prompts-on-rank-1")
    for r in (r0, r1):
        assert "ranks [1] were given other prompts or generate() arguments than rank 0" in r["error"]


# ------------------------------------------------------------------------------------------- failures
def _failing_spec(models, how: str, timeout: float) -> dict:
    case = {"name": "run", "target": "llama", "draft": "llama", "drafter": "model", "prompts": case_prompts(),
            "max_new": 40, "k": 3, "tp_timeout": timeout}
    return {"timeout": timeout, "targets": {"llama": models["folders"]["targets"]["llama"]},
            "drafts": {"llama": models["folders"]["drafts"]["llama"]}, "cases": [case],
            "fail": {"rank": 1, "forward": 6, "how": how, "hang_seconds": timeout + 3}}


def test_a_rank_that_raises_ends_both_processes_with_an_error(models):
    codes, logs, outputs, seconds = launch(_failing_spec(models, "raise", 30), models["root"] / "raise", timeout=120)
    assert codes[0] != 0 and codes[1] != 0, logs
    assert "injected failure on rank 1" in logs[1]
    assert "TensorParallelError" in logs[0] and "rank 0 of 2" in logs[0], logs[0][-2000:]
    assert outputs == [None, None]
    assert seconds < 60  # the dead peer is noticed at once, not after the 30 s timeout


def test_a_rank_that_hangs_ends_both_processes_within_the_timeout(models):
    timeout = 3
    codes, logs, outputs, seconds = launch(_failing_spec(models, "hang", timeout), models["root"] / "hang",
                                           timeout=120)
    assert codes[0] != 0 and codes[1] != 0, logs
    assert "TensorParallelError" in logs[0] and "Timed out" in logs[0], logs[0][-2000:]
    assert "TensorParallelError" in logs[1], logs[1][-2000:]  # it wakes up to a group that is gone
    assert outputs == [None, None]
    assert seconds < 60


# ------------------------------------------------------------------------------------------- single process
def test_slab_refuses_keys_with_other_head_counts():
    # The trap: a slab of the global head count fed one local head would broadcast it into both slots.
    cache = SlabCache(1, 1, 2, 4, 8)
    cache.reserve(3)
    with pytest.raises(RuntimeError, match="wrote 1 KV heads but the slab holds 2"):
        cache.layers[0].update(torch.zeros(1, 1, 3, 4), torch.zeros(1, 1, 3, 4))


def test_slab_of_a_sharded_model_holds_its_share_of_the_heads():
    model = target("llama")
    model._tp_size = 2  # as transformers marks a model it sharded
    try:
        assert SlabCache.for_model(model, 1, 4).slab.shape[2] == 1
        model._tp_size = 4
        with pytest.raises(ValueError, match="2 KV heads do not split evenly over 4"):
            SlabCache.for_model(model, 1, 4)
    finally:
        model._tp_size = None


def test_sharded_target_without_a_process_group_is_a_clear_error():
    model = tiny_model("llama", seed=3)
    model._tp_size = 2
    with pytest.raises(TensorParallelError, match="no process group is joined"):
        SpeculativeDecoder(model, None, scheduler="autoregressive")


def test_pipeline_split_is_refused():
    model = tiny_model("llama", seed=3)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}
    with pytest.raises(ValueError, match="pipeline splits are not supported"):
        SpeculativeDecoder(model, None, scheduler="autoregressive")
    model.hf_device_map = {"": "cpu"}
    check_placement(model, "target")  # one device is fine
    offloaded = tiny_model("llama", seed=3)
    offloaded.hf_device_map = {"model": "cpu", "lm_head": "disk"}
    with pytest.raises(ValueError, match="split across devices"):
        SpeculativeDecoder(offloaded, noisy_copy(tiny_model("llama", seed=3)))


def test_a_whole_model_needs_no_ranks():
    assert TensorParallelRanks.for_model(tiny_model("llama", seed=3)) is None


# ------------------------------------------------------------------------------------------- the CLI
def test_cli_under_torchrun_shards_the_target_and_only_rank_0_reports(tmp_path):
    from test_hf_models import WORDS, tiny_llama, word_tokenizer
    folder = tmp_path / "model"
    tiny_llama(vocab_size=len(WORDS) + 1).save_pretrained(folder)  # 41 ids: an uneven vocabulary split
    word_tokenizer(WORDS).save_pretrained(folder)
    prompts_file = tmp_path / "p.txt"
    prompts_file.write_text("w1 w2 w3 w1 w2 w3\nw4\nw5 w6\n")
    out = tmp_path / "run.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(WORLD),
           "-m", "specdec", "run", "--target", str(folder), "--tp", str(WORLD), "--drafter", "ngram",
           "--prompts", str(prompts_file), "--max-new-tokens", "6", "--batch-size", "2", "--check",
           "--no-chat-template", "--tp-timeout", "60", "--json", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert run.stdout.count("exact match with plain greedy decoding: 3/3 prompts") == 1, run.stdout
    data = json.loads(out.read_text())
    assert data["summary"]["exact"] == 1.0 and [len(s) for s in data["sequences"]] == [6, 6, 6]
    assert data["summary"]["stats"]["tensor_parallel"]["ranks"] == WORLD


@pytest.mark.parametrize("extra,message", [
    (["--tp", "2"], "--tp 2 runs as 2 processes, but this is 1: launch it with"),
    (["--tp", "0"], "--tp must be >= 1"),
    (["--tp", "2", "--tp-timeout", "0"], "--tp-timeout must be > 0"),
    (["--tp", "2", "--draft-dtype", "float16"], "would put a whole copy of the sharded target on every rank"),
])
def test_cli_tp_flags_are_checked_before_model_work(tmp_path, monkeypatch, capsys, extra, message):
    from specdec.apps.cli import main
    from test_hf_models import WORDS, tiny_llama
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    folder = tmp_path / "model"
    tiny_llama(vocab_size=len(WORDS) + 1).save_pretrained(folder)
    drafter = [] if "--draft-dtype" in extra else ["--drafter", "ngram"]
    assert main(["run", "--target", str(folder), *drafter, *extra]) == 2
    assert message in capsys.readouterr().err


def test_cli_tp_needs_a_target_folder(capsys):
    from specdec.apps.cli import main
    assert main(["run", "--tp", "2"]) == 2
    assert "--tp shards a --target folder" in capsys.readouterr().err


def _follower(leader_values):
    """A rank-1 TensorParallelRanks whose broadcasts hand it `leader_values` (what rank 0 sent), no processes."""
    ranks = TensorParallelRanks.__new__(TensorParallelRanks)
    ranks.rank, ranks.size, ranks.timeout = 1, 2, 1.0
    ranks.reset_stats()

    def broadcast(kind, local):
        ranks.collectives += 1
        return leader_values.clone()

    ranks._broadcast = broadcast
    return ranks


def test_a_follower_takes_rank_0s_outcome_and_counts_the_difference():
    # columns: accepted, tokens [3]; then the drafts [2] rank 0 verified
    mine = torch.tensor([[1, 5, 6, -1], [0, 9, -1, -1]])
    leader = torch.tensor([[2, 5, 6, 7, 5, 6], [0, 8, -1, -1, 4, 4]])
    host, last = _follower(leader).agree_outcome(mine, torch.tensor([[5, 6], [4, 4]]))
    assert host == [[2, 5, 6, 7], [0, 8, -1, -1]] and last.tolist() == [7, 8]


def test_a_follower_whose_drafts_differ_from_rank_0s_raises():
    leader = torch.tensor([[1, 5, 6, 5, 6]])
    ranks = _follower(leader)
    with pytest.raises(TensorParallelError, match="drafted other tokens than rank 0"):
        ranks.agree_outcome(torch.tensor([[1, 5, 6]]), torch.tensor([[5, 7]]))


def test_a_follower_takes_rank_0s_plan():
    ranks = _follower(torch.tensor([3, 2, 0]))
    plan = ranks.agree_plan(Plan(1, [0, 0], 2.0, 1.0), SpeculationController(3))
    assert (plan.width, plan.num_draft, ranks.overrides, ranks.collectives) == (3, [2, 0], 1, 1)
    fixed = SpeculationController(3, enabled=False)  # decides from the offers alone: no collective
    assert ranks.agree_plan(Plan(1, [0, 0], 2.0, 1.0), fixed).width == 1 and ranks.collectives == 1
