"""The options several subcommands share, each defined once: its flag, its type, its default and
the help that states that default (tests/test_cli_conventions.py). A command adds the ones it takes
in its own `setup_arguments` (asv's `common_args`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from dohnuts.schema import check_output_file
from dohnuts.threads import DEFAULT_CPU_THREADS

DEFAULT_RESULTS = Path("runs/bench")  # where `run` makes its run directories (ignored: results/ holds curated reference runs only)


def add_workloads(parser: argparse.ArgumentParser, *, help: str) -> None:
    """The workload YAML files, positional (none: the embedded standard suite)."""
    parser.add_argument("workloads", nargs="*", help=help)


def add_hwspec(parser: argparse.ArgumentParser, *, default: str, what: str = "hardware spec name or path") -> None:
    """`--hwspec NAME|PATH`: a built-in spec's name (hwspecs/NAME.yaml) or a spec file."""
    parser.add_argument("--hwspec", help=f"{what} (default: {default})")


def add_threads(parser: argparse.ArgumentParser, *, help: str) -> None:
    """`--threads N`: torch's threads of a CPU run (dohnuts.threads: why one by default)."""
    parser.add_argument("--threads", type=int, default=DEFAULT_CPU_THREADS, help=help)


def add_quiet(parser: argparse.ArgumentParser, *, help: str) -> None:
    """`--quiet`: warnings only on stderr."""
    parser.add_argument("--quiet", action="store_true", help=help)


def add_json_output(parser: argparse.ArgumentParser, *, help: str) -> None:
    """`--json OUT`: also write the command's result as JSON (`check_json_output` checks the path
    before any work)."""
    parser.add_argument("--json", metavar="OUT", help=help)


def add_store(parser: argparse.ArgumentParser, *, help: str, default: str | None = None) -> None:
    """`--store PATH`: the run store (dohnuts.bench.store.run_store)."""
    parser.add_argument("--store", default=default, help=help)


def check_json_output(arg: str, inputs: list[Path]) -> Path:
    """`--json OUT` by the one output rule (dohnuts.schema.output_paths): not a symbolic link, none of
    the command's `inputs`, not in a run folder, new or a regular file (a directory, /dev/full, a
    FIFO, a name too long or a read-only place is one line, before any work); its folder created if
    need be."""
    return check_output_file(arg, inputs=inputs, field="--json", what="a JSON file to write", make_folder=True)
