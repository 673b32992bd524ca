"""One transcript line → a JSON object, within the limits, or the reason why not.

Python's JSON parser recurses once per level (100,000 nested brackets overflow its stack) and
turns `\\ud800` escapes into lone surrogates that no UTF-8 column can hold; both are refused
here with a reason, as are lines that are not JSON objects at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

from memory_dag.ingest.decoding import is_utf8
from memory_dag.ingest.limits import MAX_NESTING_DEPTH

#: A JSON escape of a UTF-16 surrogate (paired ones encode emoji; a lone one is invalid text).
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def json_object(raw: str) -> dict[str, Any]:
    """The JSON object of one transcript line; ValueError says why the line is not one."""
    try:
        record = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:
        raise ValueError(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels") from None
    if not isinstance(record, dict):
        raise ValueError(f"line is a JSON {type(record).__name__}, not an object")
    # A line can only be deeper than it has brackets: most lines skip the walk.
    if raw.count("[") + raw.count("{") > MAX_NESTING_DEPTH and _depth(record) > MAX_NESTING_DEPTH:
        raise ValueError(f"JSON nested deeper than {MAX_NESTING_DEPTH} levels")
    # `\\ud800` escapes decode to lone surrogates, which no UTF-8 store can hold.
    if _SURROGATE_ESCAPE.search(raw) and not is_utf8(json.dumps(record, ensure_ascii=False)):
        raise ValueError("JSON has an unpaired surrogate escape (such as \\ud800)")
    return record


def _depth(value: Any) -> int:
    """Levels of nested lists and dicts, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((child, level + 1) for child in item)
    return deepest
