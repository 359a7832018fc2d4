"""Apps over the engine: the CLI (`python -m specdec`), the demos, the ablation and the report tables."""
