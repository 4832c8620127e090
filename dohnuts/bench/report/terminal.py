"""The consoles dohnuts-bench prints to: a user's string reaches a terminal as text, nothing else.

A workload name, a target label, a hwspec name, a path, a message a record kept: whatever a user
(or a hand-edited file) put there reaches stdout and stderr through a `SafeConsole`, which

- never reads markup in a string (`markup=False`, no emoji codes): a workload named `text [/x]` is
  printed as it is — read as markup it once ended `run` in a traceback after measuring;
- writes every control character of what it renders — the ESC of an escape sequence (clear the
  screen, set the clipboard), BEL, a C1 control, a bidi override — as its visible escape
  (`dohnuts.schema.printable`, the one sanitiser), so no name acts on the terminal.

The report's own colours are rich styles (Text spans), not characters of the text, and stay.
Progress bars take their task descriptions as plain text too (`progress_text_column`). Every
console of dohnuts/bench is one of these (tests/bench/test_terminal_text.py checks the source).
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import TextColumn
from rich.segment import Segment
from rich.text import Text

from dohnuts.schema import printable_lines


class SafeConsole(Console):
    """A rich Console that prints user strings as text only (the module docstring)."""

    def __init__(self, **kw):
        kw.setdefault("highlight", False)
        super().__init__(markup=False, emoji=False, **kw)

    def render(self, renderable, options=None):
        # Every segment of every renderable passes here (nested renderables are rendered through
        # this method too, and tables through render_lines, which calls it).
        for segment in super().render(renderable, options):
            if segment.control or segment.text.replace("\n", "").isprintable():
                yield segment
            else:
                yield Segment(printable_lines(segment.text), segment.style, segment.control)


def stdout_console() -> SafeConsole:
    """The console the commands print their reports to (stdout, no automatic highlighting)."""
    return SafeConsole(stderr=False)


def progress_text_column():
    """The description column of a progress bar: its text never read as markup, its control
    characters written as escapes before the bar measures it."""
    class PlainDescription(TextColumn):
        def render(self, task) -> Text:
            return Text(printable_lines(task.description), style=self.style, justify=self.justify)

    return PlainDescription("{task.description}", markup=False)
