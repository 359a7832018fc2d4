"""The command line: argument and prompt-file errors, a tiny exact run, and the ablation's JSON schema."""

import json

import pytest

from specdec.ablation import run_ablation
from specdec.cli import main
from specdec.prompts import load_prompts


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
