"""Prompts for the apps: files (jsonl with a text field, SpecBench's `turns` works too, or plain text, one per
line) and their encoding through a tokenizer (its chat template where it has one)."""

from __future__ import annotations

import json
import os

from ..models.demo import shipped_prompts


def load_prompts(path: str | None, limit: int | None = None) -> list[str]:
    """The prompts of `path` (None: the shipped ones), the first `limit` (>= 1) of them if given. Errors name
    the file, and the line where there is one."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be an int >= 1 (or None for every prompt), got {limit!r}")
    if path is None:
        texts = [p["text"] for p in shipped_prompts()]
    else:
        texts = _read_file(path)
    return texts[:limit] if limit is not None else texts


def _read_file(path: str) -> list[str]:
    if os.path.isdir(path):
        raise ValueError(f"prompts file {path!r} is a folder, not a file")
    if not os.path.isfile(path):
        raise ValueError(f"prompts file {path!r} does not exist")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise ValueError(f"prompts file {path!r} cannot be read ({e.strerror or e})") from None
    try:
        content = data.decode("utf-8-sig")  # a byte-order mark, if any, is not part of the first prompt
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        column = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); "
                         "save the prompts file as UTF-8") from None
    # split on newlines only, as the line numbers above count them (str.splitlines would also split inside a
    # JSON string holding U+2028, which JSON allows unescaped)
    lines = [line.removesuffix("\r") for line in content.split("\n")]
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


def encode(tokenizer, texts: list[str], chat: bool) -> list[list[int]]:
    if chat and getattr(tokenizer, "chat_template", None):
        return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)) for t in texts]
    return [list(tokenizer.encode(t)) for t in texts]
