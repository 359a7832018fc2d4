"""Prompt files for the CLI: jsonl with a text field (SpecBench's `turns` works too), or plain text, one per line."""

from __future__ import annotations

import json
import os

from .demo_models import shipped_prompts


def load_prompts(path: str | None, limit: int | None = None) -> list[str]:
    """The prompts of `path` (None: the shipped ones). Errors name the file and the line."""
    if path is None:
        texts = [p["text"] for p in shipped_prompts()]
    else:
        texts = _read_file(path)
    return texts[:limit] if limit else texts


def _read_file(path: str) -> list[str]:
    if not os.path.isfile(path):
        raise ValueError(f"prompts file {path!r} does not exist")
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    is_jsonl = path.endswith(".jsonl") or (lines and lines[0].lstrip().startswith("{"))
    texts = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        if not is_jsonl:
            texts.append(line)
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e.msg})") from None
        text = record.get("text") if isinstance(record, dict) else None
        if text is None and isinstance(record, dict) and isinstance(record.get("turns"), list) and record["turns"]:
            text = record["turns"][0]
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}:{number}: no 'text' field (a non-empty string, or SpecBench 'turns')")
        texts.append(text)
    if not texts:
        raise ValueError(f"prompts file {path!r} is empty")
    return texts
