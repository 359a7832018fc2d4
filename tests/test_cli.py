"""The command line: argument and prompt-file errors, a tiny exact run, the ablation's JSON schema, per-category
rows, fixed K, the controller's mean width, real-demo and ablate --target on a tiny saved model."""

import json
import os
import re
import sys

import pytest
import torch

import specdec_kernels as sk
from specdec.apps import cli, speed
from specdec.apps.ablation import run_ablation
from specdec.apps.check import check_against_greedy, plain_greedy
from specdec.apps.cli import main
from specdec.apps.prompts import load_prompts
from specdec.apps.real_demo import run_real_demo
from specdec.apps.report import merge_stats
from specdec.apps.speed import NOISE_GAUGE, measure, paired_speedup, table
from specdec.drafting.ngram import NgramDrafter
from specdec.models.hf import load_causal_lm


@pytest.mark.parametrize("content,message", [
    pytest.param(None, "does not exist", id="missing"),
    pytest.param("", "is empty", id="empty"),
    pytest.param('{"text": "ok"}\n{"title": "no text"}\n', ":2: no 'text' field", id="no-text-field"),
    pytest.param('{"text": "ok"}\n{broken\n', ":2: not valid JSON", id="bad-json"),
])
def test_prompt_file_errors_name_file_and_line(tmp_path, content, message):
    path = tmp_path / "prompts.jsonl"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("content,line", [
    pytest.param(b"first\nsecond \xff\xfe\n", 2, id="text"),
    pytest.param(b'{"text": "ok"}\n{"text": "ok"}\n{"text": "caf\xe9"}\n', 3, id="jsonl-latin-1"),
])
def test_undecodable_prompt_file_names_file_and_line(tmp_path, content, line):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=f":{line}: not UTF-8") as info:
        load_prompts(str(path))
    assert str(path) in str(info.value)


def test_prompt_file_that_is_a_folder(tmp_path):
    with pytest.raises(ValueError, match="is a folder") as info:
        load_prompts(str(tmp_path))
    assert str(tmp_path) in str(info.value)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_prompt_limit_must_be_at_least_one(limit):
    with pytest.raises(ValueError, match="limit"):
        load_prompts(None, limit)


def test_prompt_limit_keeps_the_first(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("a\nb\nc\n")
    assert load_prompts(str(path), 2) == ["a", "b"] and load_prompts(str(path), 9) == ["a", "b", "c"]


def test_prompt_files_jsonl_specbench_and_text(tmp_path):
    jsonl = tmp_path / "a.jsonl"
    jsonl.write_text('{"text": "one"}\n\n{"turns": ["two", "later turn"]}\n')
    text = tmp_path / "b.txt"
    text.write_text("first line\nsecond line\n")
    assert load_prompts(str(jsonl)) == ["one", "two"]
    assert load_prompts(str(text)) == ["first line", "second line"]
    assert len(load_prompts(None)) >= 20  # the shipped prompts


@pytest.mark.parametrize("argv,message", [
    pytest.param(["run", "--target", "/no/such/folder", "--drafter", "ngram"], "does not exist", id="no-folder"),
    pytest.param(["run", "--prompts", "/no/such/file.jsonl"], "does not exist", id="no-prompts"),
    pytest.param(["run", "--check", "--do-sample", "--limit", "1", "--max-new-tokens", "2"], "drop --do-sample",
                 id="check-needs-greedy"),
])
def test_cli_errors_exit_2_with_message(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.fixture
def no_model_work(monkeypatch):
    """Every way the CLI starts model work raises: a refused command line must stop before it."""
    def refuse(*args, **kwargs):
        raise AssertionError("model work started before the command line was checked")
    import specdec.apps.ablation
    import specdec.apps.demo
    import specdec.apps.real_demo
    monkeypatch.setattr(cli, "load_models", refuse)
    for module in (specdec.apps.demo, specdec.apps.real_demo, specdec.apps.ablation, cli):  # cli holds its own names
        for name in ("run_demo", "run_real_demo", "run_ablation", "load_causal_lm"):
            if hasattr(module, name):
                monkeypatch.setattr(module, name, refuse)


def _bad_flag_cases():
    cases = [
        ("threads-0", ["run", "--threads", "0"], "--threads must be >= 1"),
        ("threads-negative-demo", ["demo", "--threads", "-2"], "--threads must be >= 1"),
        ("threads-0-ablate", ["ablate", "--threads", "0"], "--threads must be >= 1"),
        ("threads-0-real-demo", ["real-demo", "--threads", "0"], "--threads must be >= 1"),
        ("limit-minus-1", ["run", "--limit", "-1"], "--limit must be >= 1, got -1"),
        ("limit-0", ["run", "--limit", "0"], "--limit must be >= 1"),
        ("real-demo-limit-0", ["real-demo", "--limit", "0"], "--limit must be >= 1"),
        ("batch-size-0", ["run", "--batch-size", "0"], "--batch-size must be >= 1"),
        ("window-0", ["run", "--scheduler", "exspec", "--window", "0"], "--window must be >= 1"),
        ("k-0", ["run", "-k", "0"], "--num-draft-tokens must be >= 1"),
        ("max-new-negative", ["run", "--max-new-tokens", "-3"], "--max-new-tokens must be >= 0"),
        ("ablate-max-new-0", ["ablate", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        ("temperature-0-sampling", ["run", "--do-sample", "--temperature", "0"], "--temperature must be"),
        ("temperature-1e-300", ["run", "--do-sample", "--temperature", "1e-300"], "1.1754944e-38"),
        ("top-p-0", ["run", "--do-sample", "--top-p", "0"], "--top-p must be in (0, 1]"),
        ("top-k-negative", ["run", "--do-sample", "--top-k", "-1"], "--top-k must be"),
        ("seed-too-large", ["run", "--seed", str(2 ** 64)], "--seed must be"),
        ("check-with-sampling", ["run", "--check", "--do-sample"], "drop --do-sample"),
        ("draft-without-target", ["run", "--draft", "/some/folder"], "--draft needs --target"),
        ("device-meta", ["run", "--device", "meta"], "--device meta holds no data"),
        ("device-garbage", ["run", "--device", "toaster"], "is not a device name"),
        ("ablate-device-meta", ["ablate", "--device", "meta"], "--device meta"),
        ("prompts-missing", ["run", "--prompts", "/no/such/file.jsonl"], "does not exist"),
        ("real-demo-prompts-missing", ["real-demo", "--prompts", "/no/such/file.jsonl"], "does not exist"),
        # the flags of issue 8: per category, fixed K, real-demo's scale, ablate --target
        ("per-category-0", ["run", "--per-category", "0"], "--per-category must be >= 1, got 0"),
        ("fixed-k-autoregressive", ["run", "--fixed-k", "--scheduler", "autoregressive"], "--fixed-k"),
        ("autoregressive-with-ngram", ["run", "--scheduler", "autoregressive", "--drafter", "ngram"],
         "decodes without a drafter"),
        ("ngram-and-draft-dtype", ["run", "--drafter", "ngram", "--draft-dtype", "float16"], "drop --draft-dtype"),
        ("early-exit-and-draft-dtype", ["run", "--drafter", "early-exit", "--draft-dtype", "float16"],
         "--drafter early-exit drafts with the target's own layers: drop --draft-dtype"),
        ("exit-layer-without-early-exit", ["run", "--exit-layer", "2"], "--exit-layer is the depth of --drafter"),
        ("exit-layer-0", ["run", "--drafter", "early-exit", "--exit-layer", "0"], "--exit-layer must be >= 1, got 0"),
        ("autoregressive-with-early-exit", ["run", "--scheduler", "autoregressive", "--drafter", "early-exit"],
         "decodes without a drafter"),
        ("target-missing-folder", ["run", "--target", "/no/such/folder", "--drafter", "ngram"],
         "--target '/no/such/folder': model folder does not exist"),
        ("real-demo-per-category-0", ["real-demo", "--per-category", "0"], "--per-category must be >= 1"),
        ("real-demo-repeats-0", ["real-demo", "--repeats", "0"], "--repeats must be >= 1"),
        ("real-demo-batch-size-0", ["real-demo", "--batch-sizes", "1", "0"], "--batch-sizes must be >= 1, got 0"),
        ("real-demo-max-new-0", ["real-demo", "--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
        ("real-demo-k-0", ["real-demo", "-k", "0"], "--num-draft-tokens must be >= 1"),
        ("real-demo-target-missing", ["real-demo", "--target", "/no/such/folder"], "model folder does not exist"),
        ("real-demo-json-folder", ["real-demo", "--json", "/"], "is a folder"),
        ("ablate-target-missing", ["ablate", "--target", "/no/such/folder"], "model folder does not exist"),
        ("ablate-draft-without-target", ["ablate", "--draft", "/some/folder"], "--draft needs --target"),
        ("ablate-draft-dtype-without-target", ["ablate", "--draft-dtype", "bfloat16"], "--draft-dtype needs --target"),
        ("ablate-batch-size-0", ["ablate", "--batch-sizes", "0"], "--batch-sizes must be >= 1"),
        ("ablate-limit-0", ["ablate", "--limit", "0"], "--limit must be >= 1"),
        ("ablate-k-0", ["ablate", "-k", "0"], "--num-draft-tokens must be >= 1"),
        ("ablate-prompts-missing", ["ablate", "--prompts", "/no/such/file.jsonl"], "does not exist"),
    ]
    if not torch.cuda.is_available():
        cases.append(("device-cuda-without-cuda", ["run", "--device", "cuda"], "--device cuda: cuda is not available"))
        cases.append(("device-cuda-1", ["run", "--device", "cuda:1"], "not available"))
    else:
        cases.append(("device-cuda-index", ["run", "--device", f"cuda:{torch.cuda.device_count()}"], "only"))
    return [pytest.param(*c[1:], id=c[0]) for c in cases]


@pytest.mark.parametrize("argv,message", _bad_flag_cases())
def test_bad_flags_are_errors_before_model_work(argv, message, capsys, no_model_work):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and message in err, err


def test_triton_backend_without_cuda_or_interpreter(monkeypatch, capsys, no_model_work):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    reason = sk.unavailable_reason("triton", torch.device("cpu"))
    assert reason  # CPU tensors without the interpreter: never runnable
    for argv in (["run", "--backend", "triton"], ["demo", "--backend", "triton"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("specdec: error: --backend triton") and reason in err, err


def test_cpp_backend_on_a_device_it_cannot_run_on(capsys, no_model_work):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (cpp runs on CPU tensors only)")
    assert main(["run", "--device", "cuda", "--backend", "cpp"]) == 2
    assert "--backend cpp" in capsys.readouterr().err


@pytest.mark.parametrize("where", ["under-a-file", "a-folder", "ablate-plot-under-a-file"])
def test_unwritable_json_is_an_error_before_the_run(tmp_path, where, capsys, no_model_work):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    if where == "under-a-file":
        argv, message = ["run", "--json", str(blocker / "out.json")], "is a file, not a folder"
    elif where == "a-folder":
        argv, message = ["run", "--json", str(tmp_path)], "is a folder"
    else:
        argv, message = ["ablate", "--plot", str(blocker / "sub" / "p.png")], "--plot"
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("specdec: error: ") and message in err, err
    assert blocker.read_text() == "x" and sorted(os.listdir(tmp_path)) == ["file.txt"]  # nothing left behind


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_read_only_folder_for_json(tmp_path, capsys, no_model_work):
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o500)
    try:
        assert main(["run", "--json", str(folder / "out.json")]) == 2
        assert "cannot be written" in capsys.readouterr().err
    finally:
        folder.chmod(0o700)


def test_writable_json_paths_pass_the_check_and_leave_nothing(tmp_path):
    existing = tmp_path / "old.json"
    existing.write_text("keep")
    cli.check_output(str(existing), "--json")
    cli.check_output(str(tmp_path / "new" / "deeper" / "out.json"), "--json")
    assert existing.read_text() == "keep" and sorted(os.listdir(tmp_path)) == ["old.json"]


def test_cli_undecodable_prompts_file(tmp_path, capsys, no_model_work):
    path = tmp_path / "p.txt"
    path.write_bytes(b"fine\n\x80oops\n")
    assert main(["run", "--prompts", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"{path}:2: not UTF-8" in err


def test_cli_autoregressive_with_a_target_folder_needs_no_drafter(tmp_path, tiny_folder, capsys):
    folder = tiny_folder
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw4\nw5 w6\n")
    out = tmp_path / "run.json"
    assert main(["run", "--target", str(folder), "--scheduler", "autoregressive", "--prompts", str(prompts),
                 "--max-new-tokens", "5", "--batch-size", "2", "--check", "--no-chat-template",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["exact"] == 1.0 and [len(s) for s in data["sequences"]] == [5, 5, 5]
    assert "no drafter" in capsys.readouterr().out


def test_cli_bad_choice_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["run", "--scheduler", "fastest"])
    assert info.value.code == 2 and "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("extra", [[], ["--exit-layer", "3"]], ids=["default-depth", "exit-layer-3"])
def test_cli_run_early_exit_is_exact(tmp_path, capsys, extra):
    out = tmp_path / "run.json"
    assert main(["run", "--drafter", "early-exit", "--limit", "3", "--max-new-tokens", "8", "--batch-size", "2",
                 "--check", "--json", str(out)] + extra) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["exact"] == 1.0 and data["summary"]["stats"]["catch_up_columns"] == 0
    assert f"its first {extra[1] if extra else 2} layers as early exit" in capsys.readouterr().out


def test_cli_early_exit_on_a_target_folder(tmp_path, tiny_folder, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w3\nw4\nw5 w6\n")
    assert main(["run", "--target", str(tiny_folder), "--drafter", "early-exit", "--prompts", str(prompts),
                 "--max-new-tokens", "5", "--batch-size", "2", "--check", "--no-chat-template"]) == 0
    assert "early exit" in capsys.readouterr().out
    assert main(["run", "--target", str(tiny_folder), "--drafter", "early-exit", "--exit-layer", "9",
                 "--prompts", str(prompts)]) == 2
    assert "--exit-layer 9: layers must be an int in 1.." in capsys.readouterr().err


def test_cli_run_embedded_pair_is_exact(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--limit", "3", "--max-new-tokens", "6", "--batch-size", "2", "--check",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["summary"]["exact"] == 1.0 and all(c["exact"] for c in data["checks"])
    assert [len(s) for s in data["sequences"]] == [6, 6, 6]
    assert "exact match with plain greedy decoding: 3/3" in capsys.readouterr().out


def test_ablation_json_schema(tmp_path):
    out = tmp_path / "ablation.json"
    report = run_ablation(quick=True, json_out=str(out), max_new_tokens=3, batch_sizes=[2], limit=2)
    assert json.loads(out.read_text()) == report
    assert set(report) >= {"runs", "machine"}
    kinds = {(r["scheduler"], r["backend"], r["realign"]) for r in report["runs"]}
    assert ("eqspec", "torch", "paper") in kinds and any(k[0] == "exspec" for k in kinds)
    for run in report["runs"]:
        assert set(run) >= {"scheduler", "backend", "realign", "batch_size", "do_sample", "tokens_per_s",
                            "total_seconds", "phase_seconds", "acceptance_rate", "equivalence"}
        assert set(run["phase_seconds"]) == {"draft", "verify", "sample", "realign", "schedule", "other"}
        assert run["equivalence"] == 1.0


# ------------------------------------------------------------------------------------------- issue 8: the apps
CATEGORY_PROMPTS = [("qa", "w1 w2 w3 w1 w2"), ("rag", "w7 w8 w9 w7 w8"), ("qa", "w4 w5 w4 w5"),
                    ("writing", "w10 w11 w10"), ("qa", "w6"), ("rag", "w3 w3 w3"), ("coding", "w12 w13 w12")]


def _prompts_file(folder, records=CATEGORY_PROMPTS):
    path = folder / "prompts.jsonl"
    path.write_text("".join(json.dumps({"category": c, "turns": [t]}) + "\n" for c, t in records))
    return path


def test_run_per_category_rows_and_total(tmp_path, capsys):
    """One generate() call per category, on one decoder: a row per category, then the total; sequences and checks
    stay in file order; --per-category keeps the first N of each (SpecBench's MT-bench ones count as one)."""
    prompts = _prompts_file(tmp_path)
    out = tmp_path / "run.json"
    assert main(["run", "--prompts", str(prompts), "--per-category", "2", "--max-new-tokens", "5",
                 "--batch-size", "2", "--check", "--show", "0", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert [(r["run"], r["prompts"]) for r in data["categories"]] == [("qa", 2), ("rag", 2), ("mt_bench", 2)]
    assert data["summary"]["run"] == "total (6 prompts)" and data["summary"]["exact"] == 1.0
    assert all(r["exact"] == 1.0 for r in data["categories"])
    assert len(data["sequences"]) == len(data["checks"]) == 6
    table = [line for line in text.splitlines() if line.startswith("| ")]
    assert [line.split(" | ")[0] for line in table[1:]] == ["| qa", "| rag", "| mt_bench", "| total (6 prompts)"]
    total, parts = data["summary"]["stats"], [r["stats"] for r in data["categories"]]
    assert total["new_tokens"] == sum(p["new_tokens"] for p in parts) == 30
    assert sum(total["width_histogram"]) == sum(sum(p["width_histogram"]) for p in parts)
    assert "3 categories, each its own generate() call" in text


def test_run_per_category_sequences_match_pooled(tmp_path):
    """Greedy output does not depend on how prompts are grouped into calls: per category == --pooled."""
    prompts = _prompts_file(tmp_path)
    per, pooled = tmp_path / "per.json", tmp_path / "pooled.json"
    common = ["run", "--prompts", str(prompts), "--max-new-tokens", "4", "--batch-size", "3", "--show", "0"]
    assert main(common + ["--json", str(per)]) == 0
    assert main(common + ["--pooled", "--json", str(pooled)]) == 0
    per, pooled = json.loads(per.read_text()), json.loads(pooled.read_text())
    assert per["sequences"] == pooled["sequences"] and pooled["categories"] == []
    assert len(per["categories"]) == 3


def test_run_table_shows_mean_width_and_plain_share(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--limit", "2", "--max-new-tokens", "6", "--batch-size", "2", "--show", "0",
                 "--json", str(out)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    assert head[head.index("tokens/step") + 1:head.index("tokens/step") + 3] == ["mean width", "plain %"]
    cells = [c.strip() for c in lines[-1].strip("|").split("|")]
    stats = json.loads(out.read_text())["summary"]["stats"]
    assert cells[head.index("mean width")] == f"{stats['mean_width']:.2f}"
    assert stats["adaptive"] is True
    for key in ("width_histogram", "mean_width", "plain_steps", "explore_steps", "predicted_tokens_per_step",
                "realised_tokens_per_step", "control_seconds", "phase_seconds", "acceptance_rate"):
        assert key in stats, key


def test_run_fixed_k_verifies_k_drafts_every_step(tmp_path, capsys):
    out = tmp_path / "run.json"
    assert main(["run", "--limit", "3", "--max-new-tokens", "9", "--batch-size", "2", "-k", "3", "--fixed-k",
                 "--check", "--show", "0", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    stats = data["summary"]["stats"]
    assert stats["adaptive"] is False and stats["plain_steps"] == 0 and stats["mean_width"] == 4.0
    assert stats["width_histogram"][:-1] == [0, 0, 0] and data["summary"]["exact"] == 1.0
    assert "fixed K=3" in data["run"] and "fixed K=3" in capsys.readouterr().out


def test_run_help_says_the_controller_is_on_by_default(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--fixed-k" in text and "controller is on by default" in text


def test_merge_stats_recomputes_rates():
    a = {"steps": 2, "drafted": 4, "accepted": 2, "new_tokens": 6, "accept_histogram": [1, 1, 0],
         "width_histogram": [1, 0, 1], "plain_steps": 1, "phase_seconds": {"draft": 1.0, "verify": 1.0},
         "predicted_tokens_per_step": 2.0, "scheduler": "eqspec", "eos": [2]}
    b = {"steps": 1, "drafted": 0, "accepted": 0, "new_tokens": 1, "accept_histogram": [1, 0, 0],
         "width_histogram": [1, 0, 0], "plain_steps": 1, "phase_seconds": {"draft": 0.0, "verify": 2.0},
         "predicted_tokens_per_step": 1.0, "scheduler": "eqspec", "eos": [2]}
    m = merge_stats([a, b])
    assert m["steps"] == 3 and m["new_tokens"] == 7 and m["eos"] == [2] and m["scheduler"] == "eqspec"
    assert m["acceptance_rate"] == 0.5 and m["mean_accepted_length"] == (2 + 3) / 3
    assert m["width_histogram"] == [2, 0, 1] and m["mean_width"] == (1 * 2 + 3 * 1) / 3
    assert m["total_seconds"] == 4.0 and m["tokens_per_s"] == 7 / 4.0
    assert m["predicted_tokens_per_step"] == (2.0 * 2 + 1.0 * 1) / 3


def test_check_shows_a_progress_bar_on_a_terminal(monkeypatch, capsys, tiny_folder):
    model, _ = load_causal_lm(tiny_folder)
    prompts = [[1, 2, 3], [4, 5]]
    want = [plain_greedy(model, p, 3)[0] for p in prompts]
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    checks = check_against_greedy(model, prompts, want, 3)
    assert all(c["exact"] for c in checks)
    bar = capsys.readouterr().err.split("--check: plain greedy reference")  # tqdm throttles its redraws
    assert len(bar) > 1 and "0/2 [" in bar[1]


def test_real_demo_on_a_tiny_folder(tmp_path, tiny_folder, capsys):
    """The real-demo plumbing, seconds on a tiny model: per category at batch 1 and 2, all categories mixed at a
    batch larger than a category, each drafter adaptive and fixed K, transformers' own generate, every output
    checked against plain greedy decoding, and the JSON (rows, table, header, command line)."""
    prompts = _prompts_file(tmp_path)
    out = tmp_path / "real.json"
    argv = ["real-demo", "--target", str(tiny_folder), "--prompts", str(prompts), "--per-category", "2",
            "--batch-sizes", "1", "2", "4", "--max-new-tokens", "4", "--repeats", "1", "--transformers",
            "--json", str(out)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["command"].endswith(" ".join(argv)) and data["header"].startswith("specdec real-demo: model")
    assert data["config"]["categories"] == {"qa": 2, "rag": 2, "mt_bench": 2}
    cells = {(r["batch_size"], r["category"]) for r in data["rows"]}
    assert cells == {(b, c) for b in (1, 2) for c in ("qa", "rag", "mt_bench")} | {(4, "all (mixed)")}
    runs = {r["run"] for r in data["rows"] if r["batch_size"] == 1}
    assert runs == {"plain", "n-gram, adaptive", "n-gram, fixed K=4", "float16 copy, adaptive",
                    "float16 copy, fixed K=4", "transformers generate", "transformers prompt lookup K=4",
                    "transformers assisted (float16 copy)"}
    assert "transformers batched generate" in {r["run"] for r in data["rows"] if r["batch_size"] == 4}
    assert all(r["greedy_matches"] == r["prompts"] for r in data["rows"]) and data["differences"] == []
    assert all(r["prompts"] == (6 if r["batch_size"] == 4 else 2) for r in data["rows"])
    assert data["table"] in text and "= greedy" in data["table"] \
        and all(line.endswith("| 6/6 |") for line in data["table"].splitlines()[2:])
    assert "outputs of all runs equal plain greedy decoding" in text


def test_speed_ups_are_medians_of_each_repeats_own_ratio(tiny_folder):
    """A repeat that meets a slow spell of the machine moves a ratio of totals, not the median of per-repeat
    ratios; every row keeps its per-repeat seconds, and both estimates."""
    assert paired_speedup([1.0, 1.0, 9.0], [1.0, 2.0, 1.0]) == 1.0  # totals would say 11/4
    assert paired_speedup([2.0, 4.0], [1.0, 1.0]) == 3.0 and paired_speedup([1.0], [0.0]) == 0.0
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    rows = measure(model, {"n-gram": NgramDrafter}, {"c": [[3, 4, 3, 4, 3], [5, 6]]}, [2], max_new=4, repeats=3,
                   show=lambda line: None, clock="cpu")
    plain = next(r for r in rows if r["run"] == "plain")["repeat_seconds"]
    for row in rows:
        assert len(row["repeat_seconds"]) == 3 and row["seconds"] == pytest.approx(sum(row["repeat_seconds"]))
        assert row["speedup"] == paired_speedup(plain, row["repeat_seconds"]) == row["cpu_speedup"]
        assert row["speedup_of_totals"] == pytest.approx(sum(plain) / row["seconds"])


def test_the_noise_gauge_is_a_second_plain_decoder_measured_like_the_rest(tiny_folder):
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    cells = {"c": [[3, 4, 3, 4, 3], [5, 6]]}
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [2], max_new=3, repeats=3, show=lambda line: None,
                   clock="cpu", noise_gauge=True)
    by = {r["run"]: r for r in rows}
    assert NOISE_GAUGE in by and by[NOISE_GAUGE]["exact"] and by[NOISE_GAUGE]["mean_width"] is None
    assert by[NOISE_GAUGE]["speedup"] == paired_speedup(by["plain"]["repeat_seconds"],
                                                        by[NOISE_GAUGE]["repeat_seconds"])
    assert f"| {NOISE_GAUGE} | 2 |" in table(rows)
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [2], max_new=3, repeats=1, show=lambda line: None)
    assert NOISE_GAUGE not in {r["run"] for r in rows}


def test_short_cells_repeat_until_plain_has_run_min_seconds(tiny_folder):
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    cells = {"c": [[3, 4, 3, 4, 3]]}
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [1], max_new=2, repeats=2, show=lambda line: None,
                   clock="cpu", min_seconds=1e6, max_repeats=5)
    assert {len(r["repeat_seconds"]) for r in rows} == {5} and {r["repeats"] for r in rows} == {5}
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [1], max_new=2, repeats=2, show=lambda line: None,
                   clock="cpu", min_seconds=1e-9)
    assert {len(r["repeat_seconds"]) for r in rows} == {2}
    for bad, message in (({"repeats": 0}, "repeats must be >= 1, got 0"),
                         ({"min_seconds": -1.0}, "min_seconds must be >= 0, got -1.0"),
                         ({"repeats": 3, "max_repeats": 2}, "max_repeats must be >= repeats (3), got 2")):
        with pytest.raises(ValueError, match=re.escape(message)):
            measure(model, {}, cells, [1], max_new=2, show=lambda line: None, **bad)


@pytest.mark.parametrize("block", [0, 1, 2], ids=["one-batch", "1-prompt", "2-prompts"])
def test_a_cell_run_block_by_block_decodes_every_prompt_once_a_repeat(tiny_folder, block, monkeypatch):
    """Blocks change when each configuration runs, not what it decodes: the outputs (and their order) are the
    whole cell's, every repeat's seconds add up its blocks' calls, and the stats of a row are its last repeat's
    calls merged (one generate call per block)."""
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    cells = {"c": [[3, 4, 3, 4, 3], [5, 6], [7, 3, 4], [4, 4, 5, 6, 3]]}
    got, whole, calls_made = {}, {}, []
    run = speed.EngineRun.run

    def logged(self, ids, *args):
        calls_made.append((id(self), tuple(ids[0])))
        return run(self, ids, *args)

    monkeypatch.setattr(speed.EngineRun, "run", logged)
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [2], max_new=4, repeats=2, show=lambda line: None,
                   clock="cpu", sequences=got, block=block)
    monkeypatch.undo()
    # every configuration (plain, n-gram adaptive and fixed) decodes a block before any decodes the next
    firsts = [first for _, first in calls_made]
    assert all(len({d for d, _ in calls_made[i:i + 3]}) == 3 and len(set(firsts[i:i + 3])) == 1
               for i in range(0, len(calls_made), 3))
    measure(model, {"n-gram": NgramDrafter}, cells, [2], max_new=4, repeats=1, show=lambda line: None,
            sequences=whole)
    assert got == whole and len(got[("c", 2, "plain")]) == 4
    calls = {0: 2, 1: 4, 2: 2}[block]  # blocks per repeat: one batch (2 prompts), 1 prompt, 2 prompts
    assert len(calls_made) == 3 * 2 * calls  # three configurations, two repeats, a call per block
    for row in rows:
        assert len(row["repeat_seconds"]) == 2 and row["exact"]
        if row["run"] != "plain":
            plain_steps = next(r for r in rows if r["run"] == "plain")["steps"]
            assert row["steps"] <= plain_steps
    plain = next(r for r in rows if r["run"] == "plain")
    # plain decoding takes max_new - 1 steps a row after its first token; in blocks of one prompt, each call is
    # its own batch of one, so the steps add up over the calls of the last repeat
    assert plain["steps"] == (4 * 3 if calls == 4 else 2 * 3)
    with pytest.raises(ValueError, match=re.escape("block must be None or an int >= 0")):
        measure(model, {}, cells, [1], max_new=2, show=lambda line: None, block=-1)
def test_plain_vs_transformers_pairs_each_prompt_and_sums_its_medians(tiny_folder):
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "plain_vs_transformers", os.path.join(os.path.dirname(__file__), "..", "bench", "plain_vs_transformers.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    rows = bench.measure(model, {"a": [[3, 4, 3, 4, 3], [5, 6]], "b": [[7, 8, 9]]}, max_new=3, pairs=3,
                         show=lambda line: None)
    assert [(r["category"], r["prompts"], len(r["pair_ratios"])) for r in rows] == [("a", 2, 3), ("b", 1, 3)]
    for r in rows:
        assert r["exact"] and r["speedup"] == pytest.approx(r["transformers_s"] / r["engine_s"])
    text = bench.table(rows)
    assert text.count("\n") == len(rows) + 2 and text.splitlines()[-1].startswith("| all | 3 |")
    with pytest.raises(ValueError, match="pairs must be >= 1, got 0"):
        bench.measure(model, {"a": [[3, 4]]}, max_new=2, pairs=0, show=lambda line: None)


def test_real_demo_without_check_and_one_drafter(tmp_path, tiny_folder, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w1 w2\nw3 w4\n")
    model, tokenizer = load_causal_lm(tiny_folder)
    report = run_real_demo(load=lambda: (model, tokenizer, "tiny"), prompts=str(prompts), per_category=None,
                           max_new_tokens=3, batch_sizes=(1, 2), repeats=1, drafters=("ngram",), fixed=False,
                           check=False, show=lambda line: None)
    assert {r["run"] for r in report["rows"]} == {"plain", "n-gram, adaptive"}
    assert {r["category"] for r in report["rows"]} == {"all"} and not report["config"]["checked"]
    assert "greedy_matches" not in report["rows"][0] and "= greedy" not in report["table"]
    assert report["header"].startswith("specdec real-demo: tiny, 2 prompts in 1 categories")


def test_real_demo_early_exit_on_a_tiny_folder(tmp_path, tiny_folder):
    prompts = tmp_path / "p.txt"
    prompts.write_text("w1 w2 w1 w2\nw3 w4\n")
    model, tokenizer = load_causal_lm(tiny_folder)
    report = run_real_demo(load=lambda: (model, tokenizer, "tiny"), prompts=str(prompts), per_category=None,
                           max_new_tokens=4, batch_sizes=(2,), repeats=1, drafters=("earlyexit",),
                           show=lambda line: None)
    runs = {r["run"]: r for r in report["rows"]}
    assert set(runs) == {"plain", "early exit (first quarter), adaptive", "early exit (first quarter), fixed K=4"}
    assert all(r["exact"] and r["greedy_matches"] == r["prompts"] for r in runs.values())
    assert runs["early exit (first quarter), fixed K=4"]["mean_width"] == 5.0


@pytest.mark.parametrize("drafter", ["float16", "ngram"])
def test_ablate_target_on_a_tiny_folder(tmp_path, tiny_folder, drafter):
    out, plot = tmp_path / "ablation.json", tmp_path / "ablation.png"
    argv = ["ablate", "--target", str(tiny_folder), "--prompts", str(_prompts_file(tmp_path)), "--limit", "3",
            "--max-new-tokens", "4", "--batch-sizes", "2", "--json", str(out), "--plot", str(plot)]
    assert main(argv + (["--drafter", "ngram"] if drafter == "ngram" else [])) == 0
    report = json.loads(out.read_text())
    kinds = {(r["scheduler"], r["backend"], r["realign"]) for r in report["runs"]}
    assert ("eqspec", "torch", "paper") in kinds and {k[0] for k in kinds} == {"autoregressive", "eqspec", "exspec"}
    assert all(r["equivalence"] == 1.0 and r["batch_size"] == 2 for r in report["runs"])
    config = report["config"]
    assert config["target"] == str(tiny_folder) and config["prompts"] == 3 and config["max_new_tokens"] == 4
    assert config["drafter"] == ("n-gram" if drafter == "ngram" else "model")
    assert config["models"] == "model target + " + ("n-gram drafter" if drafter == "ngram" else "float16 copy")
    assert plot.stat().st_size > 0 and report["command"].startswith("python -m specdec ablate")


def test_folder_flags_are_checked_before_loading(tmp_path, tiny_folder, capsys, no_model_work):
    not_a_model = tmp_path / "empty"
    not_a_model.mkdir()
    a_file = tmp_path / "file.bin"
    a_file.write_text("x")
    cases = [
        (["run", "--target", str(not_a_model), "--drafter", "ngram"], "has no config.json"),
        (["ablate", "--target", str(a_file)], "is a file, not a Hugging Face model folder"),
        (["run", "--target", str(tiny_folder)], "--target needs a drafter"),
        (["run", "--target", str(tiny_folder), "--drafter", "ngram", "--draft", str(tiny_folder)],
         "--drafter ngram drafts without a model: drop --draft"),
        (["run", "--target", str(tiny_folder), "--draft", str(tiny_folder), "--draft-dtype", "float16"],
         "two draft models"),
        (["ablate", "--target", str(tiny_folder), "--draft", str(not_a_model)], "--draft"),
        (["real-demo", "--target", str(not_a_model)], "has no config.json"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("specdec: error: ") and message in err, (argv, err)


def test_copies_run_each_adaptive_row_in_decoders_of_their_own_and_average_them(tiny_folder, monkeypatch):
    model, tokenizer = load_causal_lm(tiny_folder)
    torch.manual_seed(0)
    cells = {"c": [[3, 4, 3, 4, 3], [5, 6]]}
    made = []
    original = speed.EngineRun.__init__

    def counted(self, target, drafter, *args):
        made.append(drafter)
        original(self, target, drafter, *args)

    monkeypatch.setattr(speed.EngineRun, "__init__", counted)
    rows = measure(model, {"n-gram": NgramDrafter}, cells, [2], max_new=4, repeats=3, show=lambda line: None,
                   clock="cpu", copies=3)
    monkeypatch.undo()
    assert [r["run"] for r in rows] == ["plain", "n-gram, adaptive", "n-gram, fixed K=4"]  # copies are one row
    assert len(made) == 1 + 3 + 1 and len({id(d) for d in made if d is not None}) == 4  # a drafter each
    by = {r["run"]: r for r in rows}
    adaptive, plain = by["n-gram, adaptive"], by["plain"]["repeat_seconds"]
    assert len(adaptive["copy_seconds"]) == 3 and adaptive["exact"]
    for r, seconds in enumerate(adaptive["repeat_seconds"]):  # a repeat's time: its copies' mean
        assert seconds == pytest.approx(sum(c[r] for c in adaptive["copy_seconds"]) / 3)
    assert adaptive["speedup"] == paired_speedup(plain, adaptive["repeat_seconds"])
    assert adaptive["copy_speedups"] == [paired_speedup(plain, c) for c in adaptive["copy_seconds"]]
    assert len(by["n-gram, fixed K=4"]["copy_seconds"]) == 1  # fixed K has no controller path to average
    assert "copies" in speed.format_row(adaptive) and "copies" not in speed.format_row(by["plain"])
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match=re.escape(f"copies must be an int >= 1, got {bad!r}")):
            measure(model, {}, cells, [1], max_new=2, show=lambda line: None, copies=bad)
