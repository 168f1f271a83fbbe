"""Reading YAML the way a user means it: UTF-8 only, and no key given twice.

PyYAML's ``safe_load`` lets the last of two equal keys win without a word (a second
``budget:`` replaces the first), and raises ``UnicodeDecodeError`` on stray bytes.
Both are errors here, with the line to look at.
"""

from __future__ import annotations

from typing import Any

import yaml


class YamlProblem(ValueError):
    """The text is not what a YAML file for sweeps may hold; ``line`` is 1-based."""

    def __init__(self, line: int, problem: str, fix: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line, self.problem, self.fix = line, problem, fix


_MERGE_TAG = "tag:yaml.org,2002:merge"

#: Most values a document may hold once its aliases are expanded: nine nested levels of
#: ten aliases ("billion laughs") read in a second as shared references, and the first
#: copy of them (a validation, a dump) filled the machine's memory.
MAX_VALUES = 1_000_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a mapping with the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:  # `<<: *base`: merged by the base class
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                if key in seen:  # on another line, or twice on one: `{trials: 4, trials: 9}`
                    where = "on the same line" if seen[key] == line else \
                        f"first on line {seen[key]}"
                    raise YamlProblem(line, f"key {key!r} is given twice ({where})",
                                      "keep one of them; with two, one would be ignored")
                seen[key] = line
            except TypeError:  # an unhashable key; the base class says what is wrong
                continue
        return super().construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
                                 _UniqueKeyLoader.construct_mapping)


def decode(data: bytes) -> str:
    """``data`` as UTF-8 text, or :class:`YamlProblem` naming the line of the first bad byte."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[:exc.start].count(b"\n") + 1
        raise YamlProblem(line, f"byte 0x{data[exc.start]:02x} is not UTF-8 text",
                          "save the file as UTF-8") from None


def load(text: str) -> Any:
    """Like ``yaml.safe_load`` (only plain data, no tags that build objects; merge keys
    ``<<:`` merge), with no duplicate keys, no alias that refers to itself, and at most
    :data:`MAX_VALUES` values once aliases are expanded.

    Example:
        >>> load("base: &b {lr: 0.1}\\nrun: {<<: *b, steps: 5}")["run"]
        {'lr': 0.1, 'steps': 5}
    """
    loader = _UniqueKeyLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node) -> None:
    """:class:`YamlProblem` when aliases make ``root`` refer to itself, or expand it past
    :data:`MAX_VALUES` values (naming the line of the first anchor used more than once)."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()
    shared: list[yaml.Node] = []

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            shared.append(node)
            return sizes[key]
        if key in open_:
            raise YamlProblem(node.start_mark.line + 1, "an alias refers to the value it "
                              "is part of (a loop)", "write the value out without the loop")
        open_.add(key)
        if isinstance(node, yaml.SequenceNode):
            total = 1 + sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total = 1 + sum(size(k) + size(v) for k, v in node.value)
        else:
            total = 1
        open_.discard(key)
        sizes[key] = min(total, MAX_VALUES + 1)
        return sizes[key]

    if size(root) > MAX_VALUES:
        line = shared[0].start_mark.line + 1 if shared else 1
        raise YamlProblem(line, f"its aliases expand it to more than {MAX_VALUES:,} values",
                          "write the values out, or use an alias inside another alias's "
                          "value less deeply")
