"""Where a command may write: the one rule for every output path a user names.

    out = check_output_file(args.json, inputs=[results_a, results_b], field="--json", what="a JSON file to write")
    folder = check_output_folder(args.out, inputs=[results], field="--out")     # analyze's report files

An output is refused in one line naming it and its field, before any work, when

- it is a symbolic link, or (a folder of report files) holds one: a write would land on whatever
  the link points to;
- it is one of the command's own inputs, by any path (a symlink, a hard link, `..`): compare's
  results, history's store and its journal files, report's run files, analyze's run folder;
- it is in a run folder — a folder holding run.json or results.jsonl[.gz]: a run's files are
  written by the `dohnuts-bench run` that made it (and its report.html by `report`), so a finished
  run stays as it was made (a new folder below one is a folder of its own);
- it cannot be a regular file (dohnuts.schema.user_files.check_output: a device, a FIFO, a folder,
  a name too long).

What passes is written through a temporary file renamed into place (dohnuts.schema.strict_json:
`write_text_atomic`, `write_bytes_atomic`) or opened with O_NOFOLLOW (dohnuts.schema.JsonlFile): a
link planted after the check is replaced or refused, never followed.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from dohnuts.errors import DohnutsError
from dohnuts.schema.user_files import _fail, check_output, kind_of
from dohnuts.schema.values import short

RUN_FOLDER_FILES = ("run.json", "results.jsonl", "results.jsonl.gz")  # what makes a folder a run's


def is_run_folder(path: str | os.PathLike) -> bool:
    """Whether `path` is a run folder: it holds run.json or results.jsonl[.gz]."""
    return any(os.path.lexists(Path(path) / name) for name in RUN_FOLDER_FILES)


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths name one file: the same resolved path, or (both existing) the same inode
    (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samestat(os.stat(a), os.stat(b))
    except (OSError, ValueError):
        return False


def _refuse_link(path: Path, *, error, field, what: str) -> None:
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return  # absent (or unusable: the next check says why)
    if stat.S_ISLNK(st.st_mode):
        raise _fail(error, f"is a symbolic link (to {short(os.readlink(path), 120, str)}): a write would land on what "
                    f"it points to; name {what} itself", path, field)


def _refuse_inputs(path: Path, inputs: Iterable, *, error, field) -> None:
    for given in inputs:
        if given is not None and same_file(path, given):
            raise _fail(error, f"is an input of this command ({short(str(given), 120, str)}): writing it would "
                        "destroy what it reads; choose another path", path, field)


def _refuse_run_folder(folder: Path, path: Path, *, error, field) -> None:
    if folder.is_dir() and is_run_folder(folder):
        raise _fail(error, f"is in the run folder {short(str(folder), 120, str)}: a run's files are written only "
                    "by the run that made them; choose a path outside it", path, field)


def check_output_file(path: str | os.PathLike, *, inputs: Iterable = (), field: str | None = None,
                      what: str = "a regular file to write", error: type[DohnutsError] = DohnutsError,
                      run_folder_names: tuple[str, ...] = (), make_folder: bool | str = False) -> Path:
    """A file a command will write, by the module's rule: none of `inputs`, not a symbolic link, not
    in a run folder (except a name in `run_folder_names`: report.html for `report`), and new or
    a regular file. A missing folder is refused, or with `make_folder` created once every check has
    passed (`make_folder="later"`: left for the command to create when it writes)."""
    path = Path(path)
    _refuse_inputs(path, inputs, error=error, field=field)
    _refuse_link(path, error=error, field=field, what="the file")
    folder = path.parent
    existing = next((p for p in (folder, *folder.parents) if os.path.lexists(p)), Path("."))
    if path.name not in run_folder_names:
        _refuse_run_folder(folder, path, error=error, field=field)
    if make_folder and not os.path.lexists(folder):
        if not existing.is_dir():
            raise _fail(error, f"cannot be created: {short(str(existing), 120, str)} is not a directory", path, field)
        if make_folder == "later":
            return path
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as exc:
            raise _fail(error, f"cannot be created ({getattr(exc, 'strerror', None) or exc})", path, field) from None
    check_output(path, error=error, field=field, what=what)
    if not os.access(path.parent, os.W_OK):
        raise _fail(error, "cannot be written (its folder is not writable)", path, field)
    return path


def check_output_folder(path: str | os.PathLike, *, inputs: Iterable = (), field: str | None = None,
                        error: type[DohnutsError] = DohnutsError, create: bool = True,
                        holds_new_folders: bool = False) -> Path:
    """A folder a command writes files into, by the module's rule: not a symbolic link, holding no
    symbolic link (unless the command writes only new folders into it: `holds_new_folders`), not a
    run folder, not the folder of one of `inputs`, and a folder (created with `create`)."""
    path = Path(path)
    _refuse_link(path, error=error, field=field, what="the folder")
    exists = os.path.lexists(path)
    if exists and not path.is_dir():
        raise _fail(error, f"is not a directory (it is {kind_of(os.stat(path).st_mode)})", path, field)
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), Path("."))
    _refuse_run_folder(path, path, error=error, field=field)
    for given in inputs:
        if given is not None and same_file(path, Path(given).parent):
            raise _fail(error, f"is the folder of this command's input {short(str(given), 120, str)}: its files "
                        "would be written beside what it reads; choose another folder", path, field)
    if exists and not holds_new_folders:
        try:
            links = sorted(e.name for e in os.scandir(path) if e.is_symlink())
        except OSError as exc:
            raise _fail(error, f"cannot be read ({exc.strerror or exc})", path, field) from None
        if links:
            raise _fail(error, f"holds the symbolic link {short(links[0], 80)}: a file written there would land on "
                        "what it points to; remove it or choose another folder", path, field)
    if not exists and not existing.is_dir():
        raise _fail(error, f"cannot be created: {short(str(existing), 120, str)} is not a directory", path, field)
    if create and not exists:
        try:
            path.mkdir(parents=True, exist_ok=True)
        except (OSError, ValueError) as exc:
            raise _fail(error, f"cannot be created ({getattr(exc, 'strerror', None) or exc})", path, field) from None
    return path
