"""Paths a user names (request images, adapters, checkpoint directories and their files, data
splits, workloads, hwspecs, results, outputs): checked by `os.stat` before anything is opened.

A character or block device (`/dev/zero`: endless), a FIFO (blocks until a writer appears), a
socket, a directory where a file is expected, a name longer than the file system allows
(ENAMETOOLONG) and a file over its reader's size limit are refused with one line naming the file
(and the field it came from), in the caller's error class — never read. `read_file` and
`open_file` then open with O_NONBLOCK and check the opened descriptor again (a file swapped for a
FIFO between the stat and the open cannot block), and never read more than the limit.

    raw = read_file(path, max_bytes=16 * MIB, error=CheckpointError)            # bytes, or one line
    with open_file(path, error=RequestError, streams=True) as f: ...              # a pipe allowed
    check_output(path, error=ConfigError, field="--json")                         # before writing
"""

from __future__ import annotations

import errno
import os
import select
import stat
from pathlib import Path
from typing import BinaryIO

from dohnuts.errors import DohnutsError
from dohnuts.schema.values import one_line_error, short

KIB, MIB, GIB = 1 << 10, 1 << 20, 1 << 30


def size_words(n: int) -> str:
    """A byte count in words: `17 bytes`, `3.0 MiB`, `12.5 GiB`."""
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def kind_of(mode: int) -> str:
    """What a stat mode is, in words (`a FIFO (named pipe)`, `a character device`, ...)."""
    for test, words in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"),
                        (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


def _source(path: str | os.PathLike) -> str:
    return short(os.fspath(path), 200, convert=str)


def _fail(error: type[DohnutsError], message: str, path, field: str | None) -> DohnutsError:
    return one_line_error(error(message, source=_source(path), field=field))


def _why_not(exc: OSError, path) -> str:
    if exc.errno == errno.ENAMETOOLONG:
        longest = max((len(os.fsencode(p)) for p in Path(path).parts), default=0)
        return (f"has a name longer than the file system allows (a component of {longest} bytes; the limit is "
                f"usually 255)" if longest > 255 else "has a path longer than the file system allows")
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno == errno.ENOTDIR:
        return "does not exist (a part of its path is not a directory)"
    return f"cannot be read ({exc.strerror or exc})"


def stat_path(path: str | os.PathLike, *, error: type[DohnutsError] = DohnutsError,
              field: str | None = None) -> os.stat_result:
    """os.stat of a user's path (symlinks followed); a path that cannot be looked up (missing, a
    name too long, no permission, an embedded NUL) is one `error` line."""
    try:
        return os.stat(path)
    except OSError as exc:
        raise _fail(error, _why_not(exc, path), path, field) from None
    except ValueError:  # an embedded NUL
        raise _fail(error, "is not a usable path (it holds a NUL character)", path, field) from None


def _check_mode(st: os.stat_result, path, *, error, field, what: str, streams: bool) -> None:
    mode = st.st_mode
    if stat.S_ISREG(mode) or (streams and stat.S_ISFIFO(mode)):
        return
    raise _fail(error, f"is {kind_of(mode)}, not {what}", path, field)


def _check_size(st: os.stat_result, path, *, error, field, max_bytes: int | None, what: str) -> None:
    if max_bytes is not None and stat.S_ISREG(st.st_mode) and st.st_size > max_bytes:
        raise _fail(error, f"is {size_words(st.st_size)}, over the {size_words(max_bytes)} limit for {what}",
                    path, field)


def check_file(path: str | os.PathLike, *, max_bytes: int | None = None, error: type[DohnutsError] = DohnutsError,
               field: str | None = None, what: str = "a regular file", streams: bool = False) -> os.stat_result:
    """A regular file of at most `max_bytes` (a FIFO too with `streams`), checked by stat alone:
    nothing is opened. Returns its stat; anything else is one `error` line naming it."""
    st = stat_path(path, error=error, field=field)
    _check_mode(st, path, error=error, field=field, what=what, streams=streams)
    _check_size(st, path, error=error, field=field, max_bytes=max_bytes, what=what)
    return st


def check_dir(path: str | os.PathLike, *, error: type[DohnutsError] = DohnutsError, field: str | None = None,
              what: str = "a directory") -> None:
    """An existing directory, or one `error` line naming the path."""
    st = stat_path(path, error=error, field=field)
    if not stat.S_ISDIR(st.st_mode):
        raise _fail(error, f"is {kind_of(st.st_mode)}, not {what}", path, field)


def open_file(path: str | os.PathLike, *, max_bytes: int | None = None, error: type[DohnutsError] = DohnutsError,
              field: str | None = None, what: str = "a regular file", streams: bool = False) -> BinaryIO:
    """`check_file`, then the file opened for reading (binary). The open itself cannot block (O_NONBLOCK)
    and the descriptor is checked again, so a file replaced after the stat is refused as well.
    With `streams` a FIFO is read as a stream: it waits for a writer, then reads blocking, as a pipe is read."""
    check_file(path, max_bytes=max_bytes, error=error, field=field, what=what, streams=streams)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _fail(error, _why_not(exc, path), path, field) from None
    try:
        st = os.fstat(fd)
        _check_mode(st, path, error=error, field=field, what=what, streams=streams)
        _check_size(st, path, error=error, field=field, max_bytes=max_bytes, what=what)
    except BaseException:
        os.close(fd)
        raise
    if not stat.S_ISFIFO(st.st_mode):
        return os.fdopen(fd, "rb")
    # A pipe the user named as a stream, read from the descriptor already open: closing it and opening
    # the pipe again lost what a writer had written and closed in between (the pipe's buffer goes with
    # its last descriptor), then waited for a writer that had gone. Wait as a blocking open would, for
    # a writer to come (data, or its end closed: Linux reports no hang-up before a writer), then read
    # blocking, as pipes are read.
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN | select.POLLHUP)
        while not poller.poll():
            pass
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def read_file(path: str | os.PathLike, *, max_bytes: int, error: type[DohnutsError] = DohnutsError,
              field: str | None = None, what: str = "a regular file") -> bytes:
    """The bytes of a regular file of at most `max_bytes` (checked before it is opened, and while
    it is read: a file that grows meanwhile is refused too); one `error` line otherwise."""
    with open_file(path, max_bytes=max_bytes, error=error, field=field, what=what) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise _fail(error, f"cannot be read ({exc.strerror or exc})", path, field) from None
    if len(data) > max_bytes:
        raise _fail(error, f"is over the {size_words(max_bytes)} limit for {what}", path, field)
    return data


def check_output(path: str | os.PathLike, *, error: type[DohnutsError] = DohnutsError, field: str | None = None,
                 what: str = "a regular file to write") -> None:
    """A path a command will write: absent (its folder must exist) or a regular file. A device
    (`/dev/full`), a FIFO (would block until a reader appears), a socket, a directory and a name
    longer than the file system allows are one `error` line, before anything is computed."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if exc.errno not in (errno.ENOENT, errno.ENOTDIR):
            raise _fail(error, _why_not(exc, path).replace("cannot be read", "cannot be written"), path,
                        field) from None
        parent = Path(path).parent
        try:
            pst = os.stat(parent)
        except OSError as exc:
            why = "does not exist" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else (exc.strerror or str(exc))
            raise _fail(error, f"cannot be created: the folder {short(str(parent), 120, str)} {why}", path,
                        field) from None
        if not stat.S_ISDIR(pst.st_mode):
            raise _fail(error, f"cannot be created: {short(str(parent), 120, str)} is {kind_of(pst.st_mode)}, "
                        "not a folder", path, field)
        _check_name(path, error=error, field=field)
        return
    except ValueError:
        raise _fail(error, "is not a usable path (it holds a NUL character)", path, field) from None
    if not stat.S_ISREG(st.st_mode):
        raise _fail(error, f"is {kind_of(st.st_mode)}, not {what}", path, field)


def _check_name(path, *, error, field) -> None:
    """A name the folder can hold (no component over the file system's NAME_MAX)."""
    name = os.fsencode(Path(path).name)
    try:
        limit = os.pathconf(Path(path).parent, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):
        limit = 255
    if len(name) > limit:
        raise _fail(error, f"has a name longer than the file system allows ({len(name)} bytes; the limit is {limit})",
                    path, field)
