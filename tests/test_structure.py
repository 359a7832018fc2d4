"""The shape of the code: a one-way package graph (no import cycles, core layers never import apps or model
factories, no hidden function-level imports of the package's own modules), and the engine's host-sync budget."""

import ast
import pathlib

import pytest
import torch

from engine_models import draft, prompts, target
from specdec import EarlyExitDrafter, ModelDrafter, NgramDrafter, SpeculativeDecoder

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = {"specdec": ROOT / "specdec", "specdec_kernels": ROOT / "kernels"}
# Modules a function may import late: compiled or optional pieces whose absence is reported, not fatal.
OPTIONAL = {"specdec_kernels._C"}

# What each layer of specdec may import from specdec (prefix match); specdec_kernels is always allowed.
LAYERS = {
    "specdec.kv": ("specdec.kv",),
    "specdec.sampling": (),
    "specdec.timing": (),
    "specdec.validation": ("specdec.kv",),
    "specdec.drafting": ("specdec.kv", "specdec.drafting", "specdec.sampling"),
    "specdec.scheduling": ("specdec.kv", "specdec.drafting", "specdec.scheduling", "specdec.sampling",
                           "specdec.timing"),
    "specdec.decoder": ("specdec.kv", "specdec.drafting", "specdec.scheduling", "specdec.sampling",
                        "specdec.timing", "specdec.validation"),
    "specdec.models": ("specdec.kv", "specdec.models"),
    "specdec.processing": ("specdec.sampling",),
    "specdec.hf_generate": ("specdec.kv", "specdec.drafting", "specdec.sampling", "specdec.processing",
                            "specdec.decoder", "specdec.validation"),
}


def _modules():
    for package, folder in PACKAGES.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            yield ".".join([package] + parts), path, path.name == "__init__.py"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    if node.level == 0:
        base = node.module or ""
    else:
        parts = module.split(".")
        parts = parts if is_package else parts[:-1]
        parts = parts[:len(parts) - (node.level - 1)]
        base = ".".join(parts + ([node.module] if node.module else []))
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _imports():
    """{module: (top-level imports, function-level imports)} of the package's own modules."""
    known = {name for name, _, _ in _modules()}
    out = {}
    for name, path, is_package in _modules():
        tree = ast.parse(path.read_text())
        top, late = set(), set()

        def visit(node, in_function):
            for child in ast.iter_child_nodes(node):
                nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    if isinstance(child, ast.Import):
                        targets = [a.name for a in child.names]
                    else:  # `from X import y`: the module X.y if there is one, else X itself
                        base, *subs = _resolve(name, is_package, child)
                        targets = [t for t in subs if t in known or t in OPTIONAL] or [base]
                    hits = {t for t in targets if (t in known or t in OPTIONAL) and t != name}
                    (late if nested else top).update(hits)
                visit(child, nested)

        visit(tree, False)
        out[name] = (top, late)
    return out


IMPORTS = _imports()


def test_no_import_cycles():
    graph = {m: {t for t in top} for m, (top, _) in IMPORTS.items()}
    state, stack, cycles = {}, [], []

    def dfs(m):
        state[m] = "open"
        stack.append(m)
        for t in graph.get(m, ()):
            # a package importing its own submodules (its __init__ re-exporting them) is not a cycle
            if t.startswith(m + "."):
                continue
            if state.get(t) == "open":
                cycles.append(stack[stack.index(t):] + [t])
            elif t not in state:
                dfs(t)
        stack.pop()
        state[m] = "done"

    for m in graph:
        if m not in state:
            dfs(m)
    assert not cycles, cycles


def test_no_hidden_late_imports_of_own_modules():
    late = {m: sorted(t for t in ts if t not in OPTIONAL) for m, (_, ts) in IMPORTS.items()}
    assert {m: ts for m, ts in late.items() if ts} == {}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layers_import_only_what_is_below_them(layer):
    allowed = LAYERS[layer]
    bad = {}
    for module, (top, late) in IMPORTS.items():
        if module != layer and not module.startswith(layer + "."):
            continue
        for t in top | late:
            if t.startswith("specdec.") and not any(t == a or t.startswith(a + ".") for a in allowed):
                bad.setdefault(module, []).append(t)
    assert bad == {}, f"{layer} may import only {allowed}"


# ------------------------------------------------------------------------------------------- host syncs
SYNC_METHODS = ("tolist", "item", "__bool__", "__int__", "__float__", "__index__", "numpy")


@pytest.fixture
def sync_counter(monkeypatch):
    """Counts device-to-host reads made by the engine's own code (a frame in specdec.kv, .drafting,
    .scheduling or the decoder); on a GPU each is a sync that stalls the launch queue. Reads inside transformers
    or the kernels' dispatch are not the engine's (the engine calls the ops with check_values=False)."""
    import sys
    counts = []
    engine = tuple(str(ROOT / "specdec" / sub) for sub in ("kv", "drafting", "scheduling", "decoder.py"))

    def wrap(name):
        original = getattr(torch.Tensor, name)

        def counted(self, *args, **kwargs):
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(engine):
                counts.append((name, caller, sys._getframe(1).f_lineno))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    for name in SYNC_METHODS:
        wrap(name)
    return counts


def _drafter(kind):
    if kind == "ngram":
        return NgramDrafter()
    if kind == "early-exit":
        return EarlyExitDrafter(target("llama"), 1, early_stop=False)
    return ModelDrafter(draft("llama", "agree"), early_stop=False)


@pytest.mark.parametrize("do_sample", [False, True], ids=["greedy", "sampling"])
@pytest.mark.parametrize("realign", ["shift", "mask"])
@pytest.mark.parametrize("kind", ["model", "ngram", "early-exit"])
def test_eqspec_host_syncs_per_step(sync_counter, kind, realign, do_sample):
    # Fixed K (every step speculates) and batch 3 over 3 prompts (no refill), so every step is a full one.
    ps = prompts((4, 19, 9), seed=91)
    dec = SpeculativeDecoder(target("llama"), _drafter(kind), num_draft_tokens=3, realign=realign, adaptive=False)
    res = dec.generate(ps, max_new_tokens=20, batch_size=3, eos_token_id=[], do_sample=do_sample, seed=1)
    steps = res.stats["steps"]
    admission = 1  # the first tokens of the admitted prompts, read once
    assert steps > 5
    assert len(sync_counter) - admission <= 2 * steps, sync_counter[:12]
    per_step = (len(sync_counter) - admission) / steps
    assert per_step <= 1.0, per_step  # measured: the step's one readback of tokens and counts
