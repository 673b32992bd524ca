"""YAML front matter of notes and entries, read within explicit limits.

PyYAML's safe loader accepts documents that are harmless as text and harmful as data: a
465-byte alias "bomb" expands to ~390 million values, an alias inside its own anchor makes a
value that contains itself, thousands of nested brackets overflow Python's stack, a date such
as `2024-13-45` raises ValueError, and the keys `1`, `'1'` and `true` collapse into one. This
loader refuses the first three (limits in `limits.py`) with a reason, keeps an impossible date
as its text, and names every key by what the author wrote, reporting keys given twice. So front
matter is a bounded mapping of string keys, or one reason why not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from memory_dag.ingest.limits import (
    MAX_FRONT_MATTER_CHARS,
    MAX_FRONT_MATTER_VALUES,
    MAX_NESTING_DEPTH,
)

_MERGE_TAG = "tag:yaml.org,2002:merge"


class FrontMatterRefused(ValueError):
    """The front matter cannot be used; `line` is the 0-based line within the YAML text."""

    def __init__(self, line: int, reason: str) -> None:
        super().__init__(reason)
        self.line = line
        self.reason = reason


@dataclass
class FrontMatter:
    """The loaded mapping and the problems that did not stop it (0-based YAML line, reason)."""

    data: Any
    problems: list[tuple[int, str]] = field(default_factory=list)


def load_front_matter(text: str) -> FrontMatter:
    """Load one YAML document within the limits.

    Raises FrontMatterRefused for a limit or an alias loop, yaml.YAMLError for invalid YAML.
    """
    if len(text) > MAX_FRONT_MATTER_CHARS:
        raise FrontMatterRefused(
            0,
            f"front matter is {len(text):,} characters, over the limit of "
            f"{MAX_FRONT_MATTER_CHARS:,}; ignored",
        )
    loader = _LimitedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return FrontMatter(None)
        _check_expanded_size(node)
        data = loader.construct_document(node)
    finally:
        loader.dispose()
    # `"\ud800"` escapes load as lone surrogates, which no UTF-8 column can hold.
    try:
        json.dumps(data, default=str, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        raise FrontMatterRefused(
            0, "front matter has an unpaired surrogate escape (such as \\ud800); ignored"
        ) from None
    return FrontMatter(data, loader.problems)


class _LimitedLoader(yaml.SafeLoader):
    """SafeLoader that bounds nesting while composing and keeps keys as written."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.depth = 0
        self.problems: list[tuple[int, str]] = []

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        # Composing recurses once per level: refuse before Python's stack runs out.
        self.depth += 1
        try:
            if self.depth > MAX_NESTING_DEPTH:
                line = self.peek_event().start_mark.line
                raise FrontMatterRefused(
                    line, f"front matter nested deeper than {MAX_NESTING_DEPTH} levels; ignored"
                )
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1

    def construct_yaml_timestamp(self, node: ScalarNode) -> Any:
        try:
            return super().construct_yaml_timestamp(node)
        except (ValueError, OverflowError):
            reason = f"{node.value!r} is not a valid date; kept as text"
            self.problems.append((node.start_mark.line, reason))
            return node.value

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[str, Any]:
        """Keys as the author wrote them (`1`, `'1'`, `true` stay apart from `True`); a key given
        twice keeps its last value (YAML's rule) and is reported."""
        explicit = {id(key) for key, _ in node.value if key.tag != _MERGE_TAG}
        self.flatten_mapping(node)  # `<<: *base` merges; the mapping's own keys win
        mapping: dict[str, Any] = {}
        written_by: dict[str, Node] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, ScalarNode):
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    "found a list or mapping as a key",
                    key_node.start_mark,
                )
            name = key_node.value
            earlier = written_by.get(name)
            if earlier is not None and id(earlier) in explicit and id(key_node) in explicit:
                self.problems.append(
                    (key_node.start_mark.line, f"key {name!r} is given twice; the last is kept")
                )
            mapping[name] = self.construct_object(value_node, deep=deep)
            written_by[name] = key_node
        return mapping


_LimitedLoader.add_constructor(
    "tag:yaml.org,2002:timestamp", _LimitedLoader.construct_yaml_timestamp
)


def _check_expanded_size(root: Node) -> None:
    """Refuse a document whose aliases expand past the value or depth limit, or loop.

    Each node's expanded size is computed once (aliases share nodes), so a bomb is caught
    after a few dozen steps instead of being expanded. Anchors precede their aliases in the
    document, so the walk's own recursion is bounded by the nesting limit already checked.
    """
    sizes: dict[int, tuple[int, int]] = {}
    visiting: set[int] = set()

    def walk(node: Node) -> tuple[int, int]:
        if isinstance(node, ScalarNode):
            return 1, 1
        known = sizes.get(id(node))
        if known is not None:
            return known
        if id(node) in visiting:
            raise FrontMatterRefused(
                node.start_mark.line, "front matter contains itself (a YAML alias loop); ignored"
            )
        visiting.add(id(node))
        if isinstance(node, SequenceNode):
            children: list[Node] = node.value
        else:
            children = [part for pair in node.value for part in pair]
        count, depth = 1, 0
        for child in children:
            child_count, child_depth = walk(child)
            count += child_count
            depth = max(depth, child_depth)
            if count > MAX_FRONT_MATTER_VALUES:
                raise FrontMatterRefused(
                    node.start_mark.line,
                    f"front matter expands to more than {MAX_FRONT_MATTER_VALUES:,} values "
                    "(YAML aliases); ignored",
                )
        if depth + 1 > MAX_NESTING_DEPTH:
            raise FrontMatterRefused(
                node.start_mark.line,
                f"front matter nested deeper than {MAX_NESTING_DEPTH} levels once its YAML "
                "aliases are expanded; ignored",
            )
        visiting.discard(id(node))
        sizes[id(node)] = (count, depth + 1)
        return count, depth + 1

    walk(root)
