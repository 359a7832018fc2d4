"""Prompts for the apps: files (jsonl with a text field, SpecBench's `turns` works too, or plain text, one per
line) and their encoding through a tokenizer (its chat template where it has one)."""

from __future__ import annotations

import json
import os
from importlib import resources

from ..models.demo import shipped_prompts


# SpecBench's eight MT-bench categories are reported together, as its paper does.
MT_BENCH = frozenset({"writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"})
SPECBENCH_STYLE = "specbench_style.jsonl"  # shipped: our own prompts in SpecBench's six categories


def _check_limit(name: str, value) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(f"{name} must be an int >= 1 (or None for every prompt), got {value!r}")


def load_prompts(path: str | None, limit: int | None = None) -> list[str]:
    """The prompts of `path` (None: the shipped ones), the first `limit` (>= 1) of them if given. Errors name
    the file, and the line where there is one."""
    return [text for _, text in load_prompt_records(path, limit)]


def load_prompt_records(path: str | None, limit: int | None = None,
                        per_category: int | None = None) -> list[tuple[str | None, str]]:
    """(category or None, text) for each prompt of `path` (None: the shipped demo prompts; "specbench-style":
    the shipped SpecBench-style set). per_category keeps the first N of each category, in file order."""
    _check_limit("limit", limit)
    _check_limit("per_category", per_category)
    if path is None:
        records = [(p.get("category"), p["text"]) for p in shipped_prompts()]
    elif path == "specbench-style":
        records = _read_file(str(resources.files("specdec").joinpath("data", SPECBENCH_STYLE)))
    else:
        records = _read_file(path)
    if per_category is not None:
        seen: dict = {}
        kept = []
        for category, text in records:
            seen[category] = seen.get(category, 0) + 1
            if seen[category] <= per_category:
                kept.append((category, text))
        records = kept
    return records[:limit] if limit is not None else records


def by_category(records) -> dict:
    """{category: [texts]} in first-seen order."""
    out: dict = {}
    for category, text in records:
        out.setdefault(category, []).append(text)
    return out


def _read_file(path: str) -> list[tuple[str | None, str]]:
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
            texts.append((None, line))
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
        category = record.get("category")
        category = "mt_bench" if category in MT_BENCH else (str(category) if category is not None else None)
        texts.append((category, text))
    if not texts:
        raise ValueError(f"prompts file {path!r} is empty")
    return texts


def encode(tokenizer, texts: list[str], chat: bool) -> list[list[int]]:
    if chat and getattr(tokenizer, "chat_template", None):
        return [list(tokenizer.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True,
                                                   tokenize=True, return_dict=False)) for t in texts]
    return [list(tokenizer.encode(t)) for t in texts]
