"""Small helpers every reader's checks and messages share: one-line text, finite numbers, the median."""

from __future__ import annotations

import math
from typing import Any

from dohnuts.errors import DohnutsError


def one_line(text: Any) -> str:
    return " ".join(str(text).split())


def short(value: Any, limit: int = 80, convert=repr) -> str:
    """convert(value) (repr by default) on one line, cut to `limit` characters: an error message
    stays one readable line."""
    try:
        text = " ".join(convert(value).split())
    except ValueError:  # an integer too long to print
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[:limit - 3] + "..."


def why_not_finite(x: Any) -> str | None:
    """Why `x` is not a finite number (None when it is one). Booleans are not numbers here."""
    if isinstance(x, bool):
        return "a boolean"
    if not isinstance(x, (int, float)):
        return f"a {type(x).__name__}"
    try:
        f = float(x)
    except OverflowError:
        return "too large for a float"
    if math.isnan(f):
        return "NaN"
    return "infinite" if math.isinf(f) else None


def is_finite(x: Any) -> bool:
    return why_not_finite(x) is None


def first_nonfinite(obj: Any) -> str | None:
    """The dotted path of the first non-finite float in a parsed JSON value, or None."""
    stack = [(obj, "")]
    while stack:
        x, at = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return at or "the value"
        if isinstance(x, dict):
            stack.extend((v, f"{at}.{k}" if at else str(k)) for k, v in reversed(list(x.items())))
        elif isinstance(x, (list, tuple)):
            stack.extend((v, f"{at}[{i}]") for i, v in reversed(list(enumerate(x))))
    return None


def median(values) -> float:
    """The median of a non-empty iterable, as a float (statistics.median's arithmetic)."""
    xs = sorted(values)
    n = len(xs)
    return float(xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2)


def _escape(text: str | None) -> str | None:
    """`text` with every unprintable character (newline, NUL, ...) written as its escape."""
    if text is None or text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def printable(text: Any) -> str:
    """`text` safe for a terminal line — the one sanitiser of user strings on display: every
    unprintable character (a newline, an escape sequence's ESC, BEL, NUL, a C1 control, a bidi
    override) written as its escape, so a user's workload name or path cannot move the cursor,
    recolour the screen or write the clipboard. Rich markup is a matter of the console:
    dohnuts.bench.report.terminal.SafeConsole never reads it, and writes its text through this."""
    return _escape(str(text)) or ""


def printable_lines(text: Any) -> str:
    """`printable` line by line: the line breaks kept, every other control character escaped."""
    return "\n".join(printable(line) for line in str(text).split("\n"))


def one_line_error(exc: DohnutsError) -> DohnutsError:
    """`exc` as one line: a key, path or value holding a newline or another control character
    (a YAML key may hold anything) is written with escapes. Same class, same fields."""
    message, source, field = _escape(exc.message), _escape(exc.source), _escape(exc.field)
    if (message, source, field) == (exc.message, exc.source, exc.field):
        return exc
    return type(exc)(message, source=source, field=field)
