"""`dohnuts-bench compare RUN_A RUN_B`: run B against run A per workload, target and stage — ratio
of medians, bootstrap interval, rank test, verdict (dohnuts.bench.analysis.compare has the rule).

Exit status 1 when a workload · target's whole call is slower in B (a CI can use it), 0 otherwise
(also when the machine's load explains the change, and it says why), 2 on bad input.
"""

from __future__ import annotations

import warnings

from rich.text import Text

from dohnuts.bench.analysis.compare import SLOWER, WALL, compare_runs
from dohnuts.bench.analysis.compare_table import comparison_dict, comparison_table, load_lines
from dohnuts.bench.analysis.records import read_records
from dohnuts.bench.commands.options import add_json_output, check_json_output
from dohnuts.bench.report.status import log
from dohnuts.bench.report.terminal import stdout_console
from dohnuts.bench.store.rundir import results_path, run_inputs
from dohnuts.errors import DohnutsError
from dohnuts.schema import write_json


def setup_arguments(subparsers) -> None:
    c = subparsers.add_parser("compare", help="compare run B against run A (ratio of medians, interval, verdict)")
    c.add_argument("run_a", metavar="RUN_A", help="run directory or results.jsonl (the baseline)")
    c.add_argument("run_b", metavar="RUN_B", help="run directory or results.jsonl (compared against RUN_A)")
    c.add_argument("--confidence", type=float, default=0.95, help="confidence of the intervals (default: 0.95)")
    c.add_argument("--min-effect", type=float, default=0.02,
                   help="smallest relative change given a verdict (default: 0.02)")
    add_json_output(c, help="also write the comparison as JSON to OUT (default: the table only)")
    c.set_defaults(func=run)


def run(args) -> int:
    """The table of dohnuts.bench.analysis.compare, the load's explanations, the exit status."""
    console = stdout_console()
    paths = [results_path(arg) for arg in (args.run_a, args.run_b)]
    runs = []
    for path in paths:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            records = read_records(path)
        for w in caught:
            log.warning("%s", w.message)
        if not any(r.phase == "steady" for r in records):
            raise DohnutsError("holds no steady-state records", source=str(path))
        runs.append(records)
    inputs = [p for path in paths for p in run_inputs(path)]
    json_out = check_json_output(args.json, inputs) if args.json else None  # refused before any work, in one line
    comparison = compare_runs(runs[0], runs[1], confidence=args.confidence, min_effect=args.min_effect,
                              label_a=str(paths[0]), label_b=str(paths[1]))
    if not comparison.rows:
        only = sorted({f"{w} / {t}" for w, t in (*comparison.only_in_a, *comparison.only_in_b)})
        raise DohnutsError(f"no (workload, target) measured in both runs ({', '.join(only)})",
                           source=f"{paths[0]} vs {paths[1]}")
    console.print(comparison_table(comparison))
    for note in comparison.warnings:  # (names are the user's: never read as markup)
        console.print(Text.assemble(("warning", "yellow"), f": {note}"))
    explained = load_lines(comparison)
    for line in explained:  # not a regression: the machine's load accounts for the change
        console.print(Text.assemble(("load", "yellow"), f": {line}"))
    if json_out is not None:
        write_json(json_out, comparison_dict(comparison), indent=2)
        log.info("wrote %s", json_out)
    if explained:
        names = [f"{r.workload} · {r.target}" for r in comparison.rows if r.stage == WALL and r.load]
        log.warning("changed, explained by the machine's load (not a regression; measure both runs on a quiet "
                    "machine to judge the code): %s", ", ".join(names))
    slower = [f"{r.workload} · {r.target}" for r in comparison.rows if r.stage == WALL and r.verdict == SLOWER]
    if slower:
        log.warning("slower in B (whole call): %s", ", ".join(slower))
        return 1
    return 0
