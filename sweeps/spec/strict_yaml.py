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


class _UniqueKeyLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a mapping with the same key twice."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
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
    """Like ``yaml.safe_load`` (only plain data, no tags that build objects), with no
    duplicate keys."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
