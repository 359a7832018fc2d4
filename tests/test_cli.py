"""The command line: argument and prompt-file errors, a tiny exact run, and the ablation's JSON schema."""

import json
import os

import pytest
import torch

import specdec_kernels as sk
from specdec.apps import cli
from specdec.apps.ablation import run_ablation
from specdec.apps.cli import main
from specdec.apps.prompts import load_prompts


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
    monkeypatch.setattr(specdec.apps.demo, "run_demo", refuse)
    monkeypatch.setattr(specdec.apps.real_demo, "run_real_demo", refuse)
    monkeypatch.setattr(specdec.apps.ablation, "run_ablation", refuse)


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


def test_cli_autoregressive_with_a_target_folder_needs_no_drafter(tmp_path, capsys):
    from test_hf_models import WORDS, tiny_llama, word_tokenizer
    folder = tmp_path / "model"
    tiny_llama(vocab_size=len(WORDS) + 1).save_pretrained(folder)
    word_tokenizer(WORDS).save_pretrained(folder)
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
