"""Training progress on stderr: a bar in a terminal, plain lines in a pipe or a CI log.

In a terminal, rich's bar: `loss 0.512 ━━━━━━━ 40/200 1.92 s/update · about 5 min 7 s left`. In a pipe, a
line at the first update and then at least every `LINE_EVERY_S` seconds of updates, so a log
never stays silent between evaluations (minutes apart):

    dohnuts: update 40 of 200, loss 0.512, 1.92 s/update, about 5 min 7 s left

The time left is the updates left times the mean wall time of an update over this process's run
(evaluations and checkpoints included, as they recur), so it does not jump with each update's
own time: it moves only as the mean does. It is said from the second update this process ran
(the first one warms up alone).
"""

from __future__ import annotations

import sys
import time

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

LINE_EVERY_S = 30.0  # in a pipe: at most this long between two progress lines while updates run


def duration(seconds: float) -> str:
    """`5 min 7 s`, `1 h 02 min`, `42 s`: a time left in words, as a log line says it."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class UpdateClock:
    """The mean wall time of an update over this process's run, and the time left at that pace."""

    def __init__(self, total: int, completed: int):
        self.total = total
        self.first: tuple[int, float] | None = None  # (update, time) of the first update this process ran
        self.last, self.now = completed, 0.0

    def tick(self, update: int, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        if self.first is None:
            self.first = (update, now)
        self.last, self.now = update, now

    def seconds_per_update(self) -> float | None:
        """None until two updates of this process are done (the first one is its own warm-up)."""
        if self.first is None or self.last <= self.first[0]:
            return None
        return (self.now - self.first[1]) / (self.last - self.first[0])

    def seconds_left(self) -> float | None:
        mean = self.seconds_per_update()
        return None if mean is None else mean * max(0, self.total - self.last)


class TrainingProgress:
    """`with TrainingProgress(total, completed, enabled=...) as progress: trainer.train(progress=progress.update)`.
    Disabled (another rank than 0): nothing at all."""

    def __init__(self, total: int, completed: int = 0, *, enabled: bool = True, terminal: bool | None = None,
                 every_s: float = LINE_EVERY_S, write=None):
        self.enabled = enabled
        self.terminal = _stderr_is_terminal() if terminal is None else terminal
        self.every_s = every_s
        self.clock = UpdateClock(total, completed)
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self._last_line: float | None = None
        self._bar = self._task = None
        if enabled and self.terminal:

            self._bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[pace]}"), transient=False)
            self._task = self._bar.add_task("training", total=total, completed=completed, pace="")

    def __enter__(self) -> TrainingProgress:
        if self._bar is not None:
            self._bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def pace(self) -> str:
        """`1.92 s/update · about 5 min 7 s left`, or "" before the mean exists."""
        mean, left = self.clock.seconds_per_update(), self.clock.seconds_left()
        return "" if mean is None else f"{mean:.2f} s/update · about {duration(left)} left"

    def line(self, update: int, loss: float) -> str:
        mean, left = self.clock.seconds_per_update(), self.clock.seconds_left()
        pace = "" if mean is None else f", {mean:.2f} s/update, about {duration(left)} left"
        return f"dohnuts: update {update} of {self.clock.total}, loss {loss:.3f}{pace}"

    def update(self, update: int, loss: float, now: float | None = None) -> None:
        """After each update: the bar moves; in a pipe a line when the last one is `every_s` old."""
        if not self.enabled:
            return
        now = time.monotonic() if now is None else now
        self.clock.tick(update, now)
        if self._bar is not None:
            self._bar.update(self._task, completed=update, description=f"loss {loss:.3f}", pace=self.pace())
        elif self._last_line is None or now - self._last_line >= self.every_s or update == self.clock.total:
            self._last_line = now
            self.write(self.line(update, loss))
