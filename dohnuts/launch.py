"""`--nproc-per-node N`: the same `dohnuts` command as N processes under torchrun.

torchrun's agent starts the workers and ends them all when one fails; this module starts
torchrun, passes the workers' own messages through, reads torchrun's report for the failed rank,
and carries the run's own outcome back from rank 0 (torchrun reads any non-zero exit status as a
failed worker, so rank 0 writes it to a status file instead and every worker exits 0).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from dohnuts.runtime.process_group import World

_ROOT_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)")
_ROOT_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)")
_FIRST_FAILURE = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+)")
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s?")


def torchrun_failure(lines) -> tuple[int | None, int | None]:
    """(failed rank, its exit code) from torchrun's log lines, or (None, None): the first failure
    it logged ("failed (exitcode: 17) local_rank: 1"), corrected by the "Root Cause" block of its
    report (the other ranks it stopped come under "Failures")."""
    failed_rank = exitcode = None
    root = False
    for line in lines:
        m = _FIRST_FAILURE.search(line)
        if m and failed_rank is None:
            exitcode, failed_rank = int(m.group(1)), int(m.group(2))
        if "Root Cause" in line:
            root = True
        elif root and (m := _ROOT_RANK.match(line)):
            failed_rank = int(m.group(1))
        elif root and (m := _ROOT_EXIT.match(line)):
            exitcode = int(m.group(1))
    return failed_rank, exitcode


@dataclass(frozen=True)
class LaunchResult:
    returncode: int
    failed_rank: int | None = None
    exitcode: int | None = None


def launch(argv: list[str], nproc: int, entry: tuple[str, ...] = ("-m", "dohnuts")) -> LaunchResult:
    """Run `python ENTRY ARGV` as `nproc` processes under torchrun (standalone rendezvous on this
    host). The workers' own lines pass through; torchrun's error report is read, not shown: when a
    worker fails torchrun ends the others, and the caller reports the failed rank in one line.
    `entry`: the workers' entry point (tests start an entry that injects a fault)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           *entry, *argv]
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    status = tempfile.NamedTemporaryFile(prefix="dohnuts-status-", delete=False)
    status.close()
    env[STATUS_FILE] = status.name
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
    lines = []
    for line in proc.stderr:
        lines.append(line)  # torchrun's report, read for the failed rank once it ends
        text = _RANK_PREFIX.sub("", line)
        if text.startswith("dohnuts:"):  # the workers' own messages; tracebacks and torchrun's log are read only
            sys.stderr.write(text)
    code = proc.wait()
    failed_rank, exitcode = torchrun_failure(lines)
    try:
        with open(status.name) as f:
            reported = f.read().strip()
    finally:
        os.unlink(status.name)
    if code == 0 and reported:  # the run's own outcome, e.g. 2: some request lines were refused
        code = int(reported)
    return LaunchResult(code, failed_rank, exitcode)


STATUS_FILE = "DOHNUTS_STATUS_FILE"


def report_status(world: World, code: int) -> int:
    """A rank's exit status for the launcher: torchrun reads any non-zero status as a failed worker,
    so rank 0 hands a run's own outcome (2: some lines refused) to the launcher in a file and the
    workers exit 0. Without a launcher (plain torchrun) the code is returned as it is."""
    path = os.environ.get(STATUS_FILE)
    if not path:
        return code
    if world.is_main:
        with open(path, "w") as f:
            f.write(str(code))
    return 0
