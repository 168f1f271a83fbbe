"""The terminal: consoles that print text as text, and how untrusted text is cleaned.

Much of what sweeps prints comes from elsewhere: a trainer's errors and metric names,
knob values, reasons and names read back from a results folder, an owner file. rich
reads ``[...]`` in a string as markup (``[/INST]`` raises ``MarkupError``) and ``:name:``
as an emoji; a terminal runs the escape codes in it (colours, cursor moves, a window
title, OSC 8 links, clipboard writes). So the consoles made here (:func:`console`) have
markup, emoji and highlighting off and :func:`clean` every piece of text they render
(tables and live panels too); styled words are built with :class:`rich.text.Text`.
Text printed without rich goes through :func:`echo`.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable
from typing import IO, Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.text import Text

#: Escape sequences: CSI (7-bit and 8-bit) whole; a string (OSC, DCS, SOS, PM, APC: a
#: title, a link, a clipboard write) whole up to its terminator, or, unterminated, its
#: introducer and numeric parameters (the rest stays, as text); any other ESC sequence.
_STRING = r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])"
_SEQUENCE = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    rf"|{_STRING}[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)"
    rf"|{_STRING}[0-9;]*"
    r"|\x1b[ -/]*[0-~]?")
#: Control characters left after that: C0 but newline and tab, DEL, C1.
#: Control characters, and the bidirectional controls that reorder what a terminal shows
#: (U+202E, right-to-left override, turns "note=txt.exe" into "note=exe.txt").
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e"
                      r"\u2066-\u2069]")


def clean(text: Any) -> str:
    """``text`` as a string without terminal escape sequences, control characters
    (newline and tab stay) or bidirectional controls.

    Example:
        >>> clean("bad [/INST] \\x1b[31mred\\x1b]0;title\\x07 ok\\r\\n")
        'bad [/INST] red ok\\n'
    """
    text = str(text)
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub("", _SEQUENCE.sub("", text))


class TextConsole(Console):
    """A rich console that cleans (:func:`clean`) every string before rich makes it a
    ``Text`` (which would drop a BEL, leaving a window-title sequence unterminated) and
    the text of everything it renders; rich's own control segments (a live panel's
    cursor moves) pass unchanged."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(clean(text), **options)

    def render(self, renderable: RenderableType,
               options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for segment in super().render(renderable, options):
            if segment.control or not _CONTROL.search(segment.text):
                yield segment
            else:
                yield Segment(clean(segment.text), segment.style)


#: Width of a console that is not a terminal (a pipe, a log file, CI) when ``COLUMNS`` is
#: not set: tables keep their natural width instead of wrapping numbers at rich's 80.
PIPE_WIDTH = 200


def console(*, stderr: bool = False, file: IO[str] | None = None) -> Console:
    """A console for sweeps' output (stdout, or stderr, or ``file``): text printed as
    text, cleaned, never markup; :data:`PIPE_WIDTH` wide when it is not a terminal."""
    out = TextConsole(stderr=stderr, file=file, markup=False, emoji=False, highlight=False,
                      soft_wrap=True)
    if not out.is_terminal and not os.environ.get("COLUMNS"):
        out.width = PIPE_WIDTH
    return out


def flagged(word: str, rest: Any, style: str = "bold red") -> Text:
    """``word`` in ``style``, then ``rest`` (cleaned, as text): ``stopped: <verdict>``."""
    return Text.assemble((word, style), clean(rest))


def echo(text: Any, file: IO[str] | None = None) -> None:
    """``print`` of :func:`clean` text (to stdout unless ``file``)."""
    print(clean(text), file=file if file is not None else sys.stdout)


def echo_stderr(text: Any) -> None:
    """:func:`echo` to stderr: warnings and notes, which may carry a folder's name or a
    tracking error."""
    echo(text, file=sys.stderr)


def shell_word(text: Any) -> str:
    """``text`` as one shell word, for a command printed to be copied (a path with a
    space in it would split): unchanged when it needs no quoting.

    Example:
        >>> shell_word("/tmp/results/demo"), shell_word("/tmp/my results/demo")
        ('/tmp/results/demo', "'/tmp/my results/demo'")
    """
    return shlex.quote(str(text))
