"""Model factories for tests, demos and benchmarks: tiny offline models built from configs with a fixed seed
(tiny), the embedded demo pair (demo), and local Hugging Face folders (hf). The engine never imports these."""

from .tiny import FAMILIES, agreeing_draft, model_family, noisy_copy, tiny_model, unrelated_draft

__all__ = ["FAMILIES", "agreeing_draft", "model_family", "noisy_copy", "tiny_model", "unrelated_draft"]
