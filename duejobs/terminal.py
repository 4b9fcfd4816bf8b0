"""Text for a terminal: user data (keys, types, errors, payloads) with the characters that
would steer the terminal escaped, so that a key cannot clear the screen, move the cursor or
forge a row of output. JSON output needs none of this: its encoder escapes them already.
For a web page (the dashboard), the bidirectional controls alone: HTML escaping covers the
rest, and a browser shows line breaks as text."""

from __future__ import annotations

import re

# C0 and C1 controls (ESC, CR, LF, backspace...), DEL, the line and paragraph separators, the
# zero-width space (two keys that read alike, one with it) and the bidirectional marks and
# overrides that reorder what is shown.
_STEERING = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200b\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
# In a page: the bidirectional marks, embeddings, overrides and isolates, and the zero-width
# space.
_BIDI = re.compile("[\u061c\u200b\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(value: object) -> str:
    """``value`` as text, each steering character written as its escape (``\\x1b``)."""
    return _STEERING.sub(_escape, str(value))


def bidi_escaped(value: str) -> str:
    """``value`` with each bidirectional control written as its escape (``\\u202e``): a
    value shown in a page cannot make the text around it read another way round."""
    return _BIDI.sub(_escape, value)


_NAMED = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(found: re.Match[str]) -> str:
    char = found.group()
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"
