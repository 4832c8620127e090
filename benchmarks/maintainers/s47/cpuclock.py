"""Scratch (session 47): each test's CPU time — getrusage of the pytest process and of the children
it waited for, around each test's protocol (setup included); one JSON of rows a worker.

    rm -f /tmp/cpuplug/rows-*.json; mkdir -p /tmp/cpuplug
    PYTHONPATH=benchmarks/maintainers/s47 .venv/bin/python -m pytest -p cpuclock -n auto --dist worksteal \
        -m "not timing and not full" -q -p no:cacheprovider
"""
import os, resource, json, time
import pytest

_rows = []

def _cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime, c.ru_utime + c.ru_stime

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    s0, c0 = _cpu(); t0 = time.monotonic()
    yield
    s1, c1 = _cpu()
    _rows.append((item.nodeid, round(s1 - s0, 2), round(c1 - c0, 2), round(time.monotonic() - t0, 2)))

def pytest_sessionfinish(session):
    path = f"/tmp/cpuplug/rows-{os.getpid()}.json"
    json.dump(_rows, open(path, "w"))
