"""specdec: batch speculative decoding engines (EQSPEC, EXSPEC) on Hugging Face models."""
