"""Scratch (session 44): does a worker thread's device work end a capture? The GPU tests'
busy_preparing_thread (new images prepared on the session) beside (1) a tiny session's first predict calls (their passes captured) and
(2) a training microbatch's capture, with torch.cuda.graph's capture mode forced to "global" (the
default, before) and "thread_local" (landed). Prints each mode's graph stats.
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s44/capture_modes.py"""
import sys
import torch
import pytest

import tests.gpu.helpers as helpers

mode = sys.argv[1]
_init = torch.cuda.graph.__init__


def forced(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
    _init(self, cuda_graph, pool=pool, stream=stream, capture_error_mode=mode)


torch.cuda.graph.__init__ = forced
import dohnuts.api as api
from dohnuts.train.task import synthetic_requests

mp = pytest.MonkeyPatch()
helpers._wide_tiny(mp)
s = api.load("tiny", device="cuda", dtype=torch.bfloat16)
reqs = synthetic_requests(2, questions=4, shared_prefix=200, seed=3)
import pathlib, tempfile
with helpers.busy_preparing_thread(s, pathlib.Path(tempfile.mkdtemp())) as rounds:
    s.predict(reqs)
print(mode, "predict:", s.graphs.stats().to_dict(), "worker rounds", rounds[0], flush=True)
