"""examples/generate_batch.py, the README's migration from model.generate at batch 1 to specdec.generate at batch
8, runs unchanged on a local folder and finds every row equal to the prompt decoded alone."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_example(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "examples", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PROMPTS = ["w3 w4 w5 w3 w4", "w7", "w9 w10 w11 w12 w13 w9 w10", "w20 w21", "w5 w5 w5", "w30 w31 w32",
           "w14 w15 w16 w17", "w8 w6"]


def test_generate_batch_example_rows_equal_prompts_alone(tiny_folder, capsys):
    example = load_example("generate_batch")
    argv = ["--target", str(tiny_folder), "--max-new-tokens", "8"]
    for p in PROMPTS:
        argv += ["--prompt", p]
    assert example.main(argv) == 0
    out = capsys.readouterr().out
    assert f"rows equal to model.generate(prompt alone, assistant_model=draft): {len(PROMPTS)}/{len(PROMPTS)}" in out


def test_new_tokens_stops_after_the_first_eos():
    import torch
    example = load_example("generate_batch")
    row = torch.tensor([9, 9, 5, 2, 7, 2, 2])
    assert example.new_tokens(row, 2, {2}) == [5, 2]
    assert example.new_tokens(row, 2, set()) == [5, 2, 7, 2, 2]
