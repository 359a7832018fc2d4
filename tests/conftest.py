"""Test set-up. On this CPU machine Triton runs through its interpreter, which must be switched on before any
kernel module is imported; threads are pinned because a 2-core machine is badly hurt by oversubscription.

SPECDEC_TEST_DEVICE=cuda (used by bench/gpu_check) runs the kernel tests on a GPU: inputs are built on the CPU
from seeded generators, moved to the device for the op, and compared on the CPU with the reference.
"""

import os

DEVICE_NAME = os.environ.get("SPECDEC_TEST_DEVICE", "cpu")
if DEVICE_NAME == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ.get("SPECDEC_THREADS", "1")))

import specdec_kernels as sk  # noqa: E402

DEVICE = torch.device(DEVICE_NAME)
ALL_BACKENDS = ("torch", "cpp", "triton")


def backend_params():
    """Every backend, as pytest params; a backend that cannot run on the test device is skipped with its
    reason (CI builds cpp and runs triton through the interpreter, so nothing is skipped there)."""
    out = []
    for name in ALL_BACKENDS:
        reason = sk.unavailable_reason(name, DEVICE)
        marks = [pytest.mark.skip(reason=f"{name}: {reason}")] if reason else []
        out.append(pytest.param(name, id=name, marks=marks))
    return out


def to_device(obj):
    if isinstance(obj, torch.Tensor):
        return obj.to(DEVICE)
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_device(o) for o in obj)
    return obj


def to_cpu(obj):
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_cpu(o) for o in obj)
    return obj


def run(op, *args, **kwargs):
    """Call an op with its tensor arguments on the test device; results come back to the CPU."""
    return to_cpu(op(*to_device(args), **{k: to_device(v) for k, v in kwargs.items()}))


def run_inplace(op, tensors, *args, **kwargs):
    """Call an in-place op on the test device and write the results back into the CPU `tensors`."""
    single = isinstance(tensors, torch.Tensor)
    host = [tensors] if single else list(tensors)
    moved = [t.to(DEVICE) for t in host]
    out = run(op, moved[0] if single else moved, *args, **kwargs)
    for h, m in zip(host, moved):
        if m is not h:
            h.copy_(m.cpu())
    return out


def device_generator(seed: int) -> torch.Generator:
    return torch.Generator(device=DEVICE).manual_seed(seed)


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    """A tiny Llama with a word-level tokenizer, saved as a Hugging Face folder (what --target takes)."""
    from test_hf_models import WORDS, tiny_llama, word_tokenizer
    folder = tmp_path_factory.mktemp("tiny") / "model"
    tiny_llama(vocab_size=len(WORDS) + 1).save_pretrained(folder)
    word_tokenizer(WORDS).save_pretrained(folder)
    return folder
