"""YAML as settings files need it: a duplicate key is an error, and nesting is limited.

PyYAML keeps the last of two equal keys silently, and composes nested nodes recursively, so a
deeply nested file ends in a ``RecursionError``. :func:`safe_load` refuses both with a
``yaml.MarkedYAMLError`` that carries the line, like any other YAML error.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node

MAX_DEPTH = 100        # nested mappings and lists; a settings file needs a handful
MERGE_TAG = "tag:yaml.org,2002:merge"


class StrictLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys and nesting deeper than ``MAX_DEPTH``."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:  # type: ignore[override]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise ConstructorError(None, None, f"nested more than {MAX_DEPTH} levels deep",
                                       self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:  # type: ignore[override]
        if isinstance(node, MappingNode):
            first: dict[Any, Node] = {}
            for key_node, _ in node.value:
                if key_node.tag == MERGE_TAG:         # `<<: *base` may repeat keys on purpose
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    earlier = first.setdefault(key, key_node)
                except TypeError:                     # an unhashable key: SafeLoader reports it
                    continue
                if earlier is not key_node:
                    raise ConstructorError(None, None, f"duplicate key {key!r} (first on line "
                                           f"{earlier.start_mark.line + 1})", key_node.start_mark)
        return super().construct_mapping(node, deep=deep)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with :class:`StrictLoader`."""
    return yaml.load(text, Loader=StrictLoader)  # noqa: S506 (a SafeLoader subclass)
