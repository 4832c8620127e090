"""A pytest plugin that writes each test's CPU time: the test process's own and that of the
processes it started and reaped (`getrusage` RUSAGE_SELF and RUSAGE_CHILDREN around the test's
setup, call and teardown), with its wall time, one JSON line a test. Under pytest-xdist each worker
runs one test at a time, so the differences are that test's. How the ledger's M40 split the test
command's CPU:

    rm -f /tmp/pytest_cpu.jsonl
    PYTHONPATH=benchmarks/maintainers .venv/bin/python -m pytest -p pytest_cpu -n auto --dist worksteal \\
        -m "not timing and not full" -q -p no:cacheprovider
    # then sort /tmp/pytest_cpu.jsonl by self + children
"""
import json
import resource
import time

import pytest

LOG = "/tmp/pytest_cpu.jsonl"


def _cpu() -> tuple[float, float]:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    own, children = _cpu()
    start = time.perf_counter()
    yield
    own2, children2 = _cpu()
    with open(LOG, "a", encoding="utf-8") as f:
        f.write(json.dumps({"id": item.nodeid, "self": own2 - own, "children": children2 - children,
                            "wall": time.perf_counter() - start}) + "\n")
