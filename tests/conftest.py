"""Test configuration.

One torch thread per test process, and in the processes the tests start (OMP_NUM_THREADS, unless
set already): on a shared 2-core machine an operator split over more threads than free cores
waits at every barrier for a thread the scheduler has parked — a tiny-preset training update took
0.2–0.4 s on one thread and 1.5–18 s on two while other work kept the cores busy (issue 34 saw a
7-minute test run take 27 under load; docs/measurement.md, "A CPU run").

A thread that waits at a barrier sleeps instead of spinning (OMP_WAIT_POLICY=passive, unless
set already): the test command runs a process a core and one more, so a test that asks for two
threads (tests/test_threads_option.py) shares its cores with other tests, where spinning threads
burn CPU time the other tests need (docs/history/evolution.md M37).

Every test process writes the bytecode of what it imports (PYTHONDONTWRITEBYTECODE removed from
the environment the test processes inherit, and `sys.dont_write_bytecode` off in this one): the
README installs with `pip --no-compile`, so the first process to import a module compiles it and
leaves its .pyc for the next. Where the environment forbade writing (a machine or image that sets
PYTHONDONTWRITEBYTECODE=1, as this project's own session machines do), each of the test command's
hundred-odd processes compiled torch and transformers again, a quarter of the test command's CPU
time (docs/history/evolution.md M38).

transformers (the reference implementation) picks fla's kernels whenever `fla` imports, even
for CPU tensors where they cannot run, and it decides when its Qwen3.5 module is imported. The
tests always compare against transformers' plain-torch paths: on a GPU machine, hide fla while
that module is imported, then un-hide it so dohnuts' own fused ops can import fla; without a GPU,
fla stays hidden, and transformers is imported by the first test that needs it (not by the test
command's controlling process, which runs no test).
"""

import importlib.util
import os
import sys

os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # every process the tests start (module docstring)
sys.dont_write_bytecode = False  # and this one: it imports torch before the workers start
os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch starts its thread pool (module docstring)
os.environ.setdefault("OMP_WAIT_POLICY", "passive")  # read when the thread pool starts (module docstring)

import pytest  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

# Every fuzzer seeded: hypothesis draws the same examples on every run (derandomize: seeded from a hash
# of each test function) and keeps none between runs, so a test command never fails on an example the one
# before did not draw (issue 46). A module's own `settings(...)` start from this profile.
from hypothesis import settings as hypothesis_settings  # noqa: E402

hypothesis_settings.register_profile("dohnuts", derandomize=True, database=None)
hypothesis_settings.load_profile("dohnuts")


def _import_reference_without_fla() -> None:
    if not torch.cuda.is_available():
        sys.modules.setdefault("fla", None)  # no GPU: nothing may use fla (its kernels need CUDA)
        return
    had = sys.modules.get("fla", ...)
    sys.modules["fla"] = None  # type: ignore[assignment]
    try:
        import transformers.models.qwen3_5.modeling_qwen3_5  # noqa: F401
    except ImportError:
        pass  # transformers absent: the parity tests that need it fail on their own import
    finally:
        if had is ...:
            del sys.modules["fla"]
        else:
            sys.modules["fla"] = had


_import_reference_without_fla()

# The tests import the built-in plugins by their installed name, `dohnuts_bench_plugins`: the folder
# bench_plugins/ of this checkout, as `pip install -e .` maps it, even where the environment has
# another checkout installed (docs/architecture.md, "Packaging").
from dohnuts.bench.plugins import import_checkout_packages  # noqa: E402

import_checkout_packages()


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker a core, and one more. A test that starts processes (the CLI examples,
    torchrun ranks, served runs) waits for them, and a core would idle meanwhile (the ledger, M36)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores + 1


def pytest_collection_modifyitems(config, items):
    # The longest tests first, longest first (`slow(seconds=N)`: about N s on the 2-core CPU machine),
    # then the other slow ones: under pytest-xdist (the README's test command) each starts while
    # the other processes still have short tests to take, instead of ending the run alone.
    # Timing tests last (`timing`): the README's command runs them on their own, after the others,
    # one process alone, so that no other test loads the machine they time.
    def order(item):
        if item.get_closest_marker("timing"):
            return (2, 0)
        slow = item.get_closest_marker("slow")
        return (0, -slow.kwargs.get("seconds", 0)) if slow else (1, 0)

    items.sort(key=order)  # stable: collection order within each class
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def share_mathtext_parses() -> None:
    """Speed alone: in a test process, matplotlib parses a text's mathtext once, not once per canvas.

    Every report draws its rooflines (a PNG and an SVG a workload) on log axes whose tick labels
    are mathtext (`$\\mathdefault{10^{2}}$`); matplotlib caches a parse (`MathTextParser._parse_cached`)
    by the parser, the text, dpi, font properties and glyph flags, but 50 entries deep, and every
    Agg canvas brings a parser of its own: in a test process that draws report after report,
    nearly every label was parsed again (the CPU it cost: docs/history/evolution.md M56). Here the
    cache is keyed by the parser's one setting, its output type, instead of the parser itself, and
    keeps every entry (a few hundred labels): the same function of the same key, so the same boxes
    and the same files. A matplotlib whose cache is not that function is left as it is."""
    from matplotlib.mathtext import MathTextParser

    parse = getattr(MathTextParser.__dict__.get("_parse_cached"), "__wrapped__", None)
    if parse is None or not hasattr(MathTextParser("agg"), "_output_type"):
        return  # another matplotlib: speed only, nothing to share
    parsed: dict = {}

    def _parse_cached(self, s, dpi, prop, antialiased, load_glyph_flags):
        key = (self._output_type, s, dpi, prop, antialiased, load_glyph_flags)
        if key not in parsed:
            parsed[key] = parse(self, s, dpi, prop, antialiased, load_glyph_flags)
        return parsed[key]

    MathTextParser._parse_cached = _parse_cached


class _ShareMathtextParsesOnImport:
    """An import finder that finds nothing of its own: when matplotlib's mathtext is imported (by
    the first test that draws; not at collection, where every test process would import
    matplotlib), the module is loaded as it would be, then share_mathtext_parses runs."""

    def find_spec(self, name, path, target=None):
        if name != "matplotlib.mathtext":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        load = spec.loader.exec_module

        def load_and_share(module):
            load(module)
            share_mathtext_parses()

        spec.loader.exec_module = load_and_share
        return spec


if "matplotlib.mathtext" in sys.modules:
    share_mathtext_parses()
else:
    sys.meta_path.insert(0, _ShareMathtextParsesOnImport())


@pytest.fixture(scope="session")
def made_once(tmp_path_factory):
    """`made_once(name, make)`: a folder that `make(folder)` fills once for the whole test command.
    Under pytest-xdist a module-scoped fixture runs once per worker process — an expensive
    benchmark run made once per worker — so the first worker to ask makes
    it under a file lock (the recipe of pytest-xdist's documentation) in the folder all workers
    share, and the others wait for it and read it. The folder is the tests' to read, never to change."""
    import shutil

    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # every worker's basetemp sits in the run's one folder

    def made(name: str, make):
        folder = root / f"made-once-{name}"
        with FileLock(f"{folder}.lock"):
            if not (folder / ".made").exists():
                shutil.rmtree(folder, ignore_errors=True)  # a make that failed in another worker
                folder.mkdir()
                make(folder)
                (folder / ".made").touch()
        return folder

    return made


@pytest.fixture(scope="session")
def main_job_run(made_once):
    """The README's main job, `.venv/bin/dohnuts-bench run` (the standard suite on the CPU), run as
    printed once for the whole test command (tests/test_doc_examples.py's make_main_job): the
    folder it ran in, its run under runs/bench/, its output in stdout.txt and stderr.txt. The
    tests that only read a standard-suite run read this one (a run takes about 40 CPU seconds)."""
    from tests.test_doc_examples import make_main_job

    return made_once("readme-main-job", make_main_job)
