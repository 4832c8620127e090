"""Status and progress of the bench commands, on stderr through `logging`; the report alone goes to
stdout (so `dohnuts-bench run > report.txt` keeps the report clean and a pipe still sees progress).

In a terminal: rich's `RichHandler` and live progress bars. In a pipe or a file (a CI log): plain
lines (`HH:MM:SS message`, `HH:MM:SS warning: message`; both stamp the local time alone, ISO 8601's
`HH:MM:SS`, never a date that reads differently in each country) and, while measuring, a heartbeat line at
least every `HEARTBEAT_S` seconds saying what is measured, how many calls are done and for how
long — a run is never silent for long. `--quiet` leaves the warnings only.

Plugins log through `logging.getLogger("dohnuts.bench")` (or a child of it, e.g. the plugin's
`__name__` under it) and get the same routing.
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from dohnuts.bench.report.terminal import SafeConsole, progress_text_column
from dohnuts.schema import printable_lines

LOGGER = "dohnuts.bench"
HEARTBEAT_S = 5.0  # at most this long without a line while measuring, in a pipe
TIME_FORMAT = "%H:%M:%S"  # every status line's stamp, in a terminal and in a pipe (module docstring)

log = logging.getLogger(LOGGER)


def stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed
        return False


class _CurrentStderrHandler(logging.StreamHandler):
    """A StreamHandler on whatever `sys.stderr` is when a line is written (tests swap it)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, value):
        pass


class PlainFormatter(logging.Formatter):
    """`HH:MM:SS message`; warnings and errors say so."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime(TIME_FORMAT, time.localtime(record.created))
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"{stamp} {level}{printable_lines(record.getMessage())}"  # a user's name never acts on the terminal


def configure_logging(*, quiet: bool = False, terminal: bool | None = None) -> logging.Handler:
    """Route the `dohnuts.bench` logger to stderr: rich's handler in a terminal, plain lines
    elsewhere; INFO and above (WARNING and above with `quiet`). Each command calls it; it replaces
    the handler it installed before, so calling it again is harmless."""
    for handler in list(log.handlers):
        if getattr(handler, "dohnuts_status", False):
            log.removeHandler(handler)
    terminal = stderr_is_terminal() if terminal is None else terminal
    if terminal:


        handler: logging.Handler = RichHandler(console=SafeConsole(stderr=True), show_path=False,
                                               markup=False, omit_repeated_times=False,
                                               log_time_format=f"[{TIME_FORMAT}]")  # rich's own: [12/04/26 …]
    else:
        handler = _CurrentStderrHandler()
        handler.setFormatter(PlainFormatter())
    handler.dohnuts_status = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    log.propagate = False
    return handler


def _rich_console():
    """The console of the installed RichHandler (progress bars must share it), or None."""
    for handler in log.handlers:
        if getattr(handler, "dohnuts_status", False) and hasattr(handler, "console"):
            return handler.console
    return None


class MeasureProgress:
    """What is being measured, while it is. In a terminal a rich progress bar per task (and an
    indeterminate one per `phase`); elsewhere a line when a task or phase starts and a heartbeat
    line at least every `every_s` seconds. Disabled (`enabled=False`, `--quiet`): nothing at all.

    It has the methods the run loop calls on a rich `Progress` (`add_task`, `advance`, `update`),
    so dohnuts.bench.measure.runner.measure_workload takes either. Use it as a context manager."""

    def __init__(self, *, enabled: bool = True, every_s: float = HEARTBEAT_S):
        self.enabled = enabled
        self.every_s = every_s
        console = _rich_console() if enabled else None
        self._bar = None
        if console is not None:


            self._bar = Progress(progress_text_column(), BarColumn(), MofNCompleteColumn(),
                                 TimeElapsedColumn(), console=console)
        self._lock = threading.Lock()
        self._tasks: dict[int, dict] = {}
        self._current: int | None = None
        self._phase_task = None
        self._start = time.monotonic()
        self._last_line = self._start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> MeasureProgress:
        self._start = self._last_line = time.monotonic()
        if self._bar is not None:
            self._bar.__enter__()
        elif self.enabled:
            self._thread = threading.Thread(target=self._beat, name="dohnuts-bench heartbeat", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._bar is not None:
            self._bar.__exit__(*exc)

    # -- what the run loop calls ----------------------------------------------------------------

    def phase(self, description: str) -> None:
        """A step without a call count, described as what is being done ("preparing the run")."""
        if not self.enabled:
            return
        with self._lock:
            self._tasks[-1] = {"doing": description, "total": None, "completed": 0, "t0": time.monotonic()}
            self._current = -1
        if self._bar is not None:
            self._end_phase_bar()
            self._phase_task = self._bar.add_task(description, total=None)
        else:
            self._line(description)

    def add_task(self, description: str, total: int | None = None) -> int:
        if self._bar is not None:
            self._end_phase_bar()
            task = self._bar.add_task(description, total=total)
        else:
            task = len(self._tasks) + 1
        with self._lock:
            self._tasks[task] = {"doing": f"measuring {description}", "total": total, "completed": 0,
                                 "t0": time.monotonic()}
            self._current = task
        if self._bar is None and self.enabled:
            self._line(f"measuring {description}" + (f" (at least {total} calls)" if total else ""))
        return task

    def advance(self, task: int, advance: int = 1) -> None:
        with self._lock:
            self._tasks[task]["completed"] += advance
        if self._bar is not None:
            self._bar.advance(task, advance)

    def update(self, task: int, *, total: int | None = None, completed: int | None = None) -> None:
        with self._lock:
            if total is not None:
                self._tasks[task]["total"] = total
            if completed is not None:
                self._tasks[task]["completed"] = completed
        if self._bar is not None:
            self._bar.update(task, total=total, completed=completed)

    # -- the heartbeat ----------------------------------------------------------------------------

    def _end_phase_bar(self) -> None:
        if self._phase_task is not None:
            self._bar.update(self._phase_task, total=1, completed=1)
            self._phase_task = None

    def _line(self, message: str) -> None:
        self._last_line = time.monotonic()
        log.info(message)

    def heartbeat_line(self) -> str:
        """What is done now: `still measuring text · dohnuts: 12/21 calls, 8 s (run 34 s)`."""
        now = time.monotonic()
        with self._lock:
            task = self._tasks.get(self._current) if self._current is not None else None
            if task is None:
                return f"still working ({now - self._start:.0f} s)"
            done = f": {task['completed']}/{task['total']} calls" if task["total"] else ""
            return f"still {task['doing']}{done}, {now - task['t0']:.0f} s (run {now - self._start:.0f} s)"

    def _beat(self) -> None:
        while not self._stop.wait(min(1.0, self.every_s / 2)):
            if time.monotonic() - self._last_line >= self.every_s:
                self._line(self.heartbeat_line())
