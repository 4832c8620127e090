"""One trainer per run directory: `RunLock`, held from before the run directory is checked until the
trainer exits.

The lock is `RUN/train.lock`, an advisory `flock` on a descriptor kept open for the whole run; the
file holds the holder's PID, host and start time (JSON), so a second trainer on the same `--out`
is refused in one line naming the holder. The kernel drops a `flock` when its process ends,
however it ends (SIGKILL included): a lock file left holding a dead trainer's identity is stale,
and the next trainer takes it over, saying so. Releasing deletes the file while it is still held;
a trainer that locks a file that was deleted meanwhile sees it (another inode at the path, or none)
and starts again, so two trainers never hold two different files.

With several processes (`--nproc-per-node`), rank 0 alone holds it (it alone writes the run).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

from dohnuts.errors import CheckpointError

LOCK = "train.lock"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # exists (another user's), or not a PID we can ask about
    return True


def _describe(info: dict) -> str:
    when = info.get("started")
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(when)) if isinstance(when, (int, float)) else "?"
    return f"PID {info.get('pid', '?')} on host {info.get('host', '?')} (started {started})"


class RunLock:
    """The lock of one run directory (`acquire`, `release`; a context manager)."""

    def __init__(self, out: str | Path, log=lambda msg: None):
        self.path = Path(out) / LOCK
        self.log = log
        self.fd: int | None = None

    def acquire(self) -> RunLock:
        for _ in range(100):
            fd = self._open_locked()
            # Locked — but the file may have been released and deleted between our open and our lock
            # (its holder deletes it on release): then the lock is on a file nobody else sees; again.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        else:  # pragma: no cover - another trainer creating and deleting the file all the time
            raise CheckpointError("cannot be taken (it keeps changing)", source=str(self.path))
        try:
            previous = self._read(fd)
            if previous:  # its holder ended without releasing it (killed): stale, and ours now
                same_host = previous.get("host") == socket.gethostname()
                pid = previous.get("pid")
                state = ("is no longer running" if same_host and isinstance(pid, int) and not _alive(pid)
                         else "no longer holds it")
                self.log(f"took over the stale lock of {_describe(previous)}, which {state} ({self.path})")
            me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(me).encode(), 0)
            os.fsync(fd)
        except BaseException as exc:
            os.close(fd)
            if isinstance(exc, OSError):
                raise CheckpointError(f"cannot be written ({exc.strerror or exc}): the run directory must be "
                                      "writable", source=str(self.path)) from None
            raise
        self.fd = fd
        return self

    def _open_locked(self) -> int:
        """The lock file opened (created if need be) and flock-ed, or the one-line refusal naming its holder."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            raise CheckpointError(f"cannot be created ({exc.strerror or exc}): the run directory must be writable",
                                  source=str(self.path)) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(self._read(fd))
            os.close(fd)
            raise CheckpointError(f"the run is in use by another trainer: {holder}; wait for it to end, or choose "
                                  "another --out", source=str(self.path.parent)) from None
        except OSError as exc:
            os.close(fd)
            raise CheckpointError(f"cannot be locked ({exc.strerror or exc})", source=str(self.path)) from None
        return fd

    @staticmethod
    def _read(fd: int) -> dict:
        try:
            raw = os.pread(fd, 4096, 0)
            info = json.loads(raw) if raw.strip() else {}
        except (OSError, ValueError):
            return {"pid": "?", "host": "?"}  # unreadable: someone's lock all the same
        return info if isinstance(info, dict) else {"pid": "?", "host": "?"}

    def release(self) -> None:
        """Delete the lock file while still holding it, then let it go: nothing is left behind (a
        trainer that opened it meanwhile sees it gone once it holds it, and takes a new one)."""
        if self.fd is None:
            return
        fd, self.fd = self.fd, None
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            os.ftruncate(fd, 0)  # a folder we cannot delete in: at least say the lock is free
        finally:
            os.close(fd)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
