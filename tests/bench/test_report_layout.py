"""Reports read everywhere: on a narrow console the tables change layout instead of cutting
cells, and report.txt always holds the full tables (dohnuts.bench.analysis.render docstring).

The analysis is the committed H200 run (26 groups: long targets such as
"dohnuts-unshared · first-call", two bases, long critical cycles), rendered to recording
consoles of fixed widths, so the tests are deterministic and take about a second.

"…" is rich's mark of a truncated cell; nothing in these reports writes it otherwise, so the
narrow outputs must not contain it at all (a stricter check than "none next to a digit").
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console, Group

from dohnuts.bench.analysis import analysis_tables, analyze_records, find_hwspec, read_records
from dohnuts.bench.analysis.render import Col, FitTable
from dohnuts.bench.analysis.summary import summarize, summary_json
from dohnuts.bench.report.run_report import write_summary
from dohnuts.bench.report.text_report import full_width, print_report, summary_table
from dohnuts.bench.sections import Section

RUN = Path(__file__).resolve().parent / "fixtures" / "h200-graphs" / "results.jsonl.gz"
# a number cell or a number inside a cell ("13.6–14.0", "16074 / 0"), not the digits of a name
# ("text-2b", "qwen3.5-2b", "pcie5_x16", "p10–p90")
NUMBER = re.compile(r"(?<![\w.\-/])\d+(?:\.\d+)?(?:e[+-]\d+)?%?(?![\w.])")


@pytest.fixture(scope="module")
def records():
    return read_records(RUN)


@pytest.fixture(scope="module")
def analysis(records):
    return analyze_records(records, find_hwspec("h200"))


def _render(renderables, width: int) -> str:
    console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
    for r in renderables:
        console.print(r)
    return console.export_text()


def _numbers(text: str) -> Counter:
    return Counter(NUMBER.findall(text))


def _assert_fits(text: str, width: int) -> None:
    lines = text.splitlines()
    too_long = [line for line in lines if len(line) > width]
    assert not too_long, f"{len(too_long)} lines wider than {width}: {too_long[0]!r}"
    assert "…" not in text, next(line for line in lines if "…" in line)


@pytest.mark.parametrize("width", [80, 60, 40])
@pytest.mark.slow
def test_analysis_tables_fit_the_width_and_keep_every_number(analysis, width):
    wide = _render(analysis_tables(analysis), 200)
    narrow = _render(analysis_tables(analysis), width)
    _assert_fits(narrow, width)
    # every stage name, efficiency percentage and other number of the wide layout is still there,
    # as many times (a cut or folded number would change the count)
    stages = {r.stage for g in analysis.groups for r in g.stages}
    assert stages <= set(re.findall(r"[a-z0-9]+", narrow))
    effs = {f"{r.efficiency[b]:.1%}" for g in analysis.groups for r in g.stages for b in g.bases
            if r.efficiency[b] is not None}
    assert effs and all(e in narrow for e in effs)
    missing = _numbers(wide) - _numbers(narrow)
    assert not missing, f"numbers of the wide layout missing at width {width}: {dict(missing)}"


def test_layout_depends_on_the_width(analysis):
    stage, call = analysis_tables(analysis)[:2]
    wide = _render([stage], 200)
    assert any("bound ms" in line and "GFLOP" in line for line in wide.splitlines())  # one full table
    split = _render([stage], 80)
    assert not any("bound ms" in line and "GFLOP" in line for line in split.splitlines())
    assert split.count("┃ stage") == 2  # measured / bounds / efficiency, then limiter / verdict / work
    stacked = _render([stage], 40)
    assert "┃" not in stacked and "eff datasheet 0.3%" in stacked  # one block per stage
    assert _render([call], 60).count("┃ quantity") == 1  # the whole call still side by side, labels wrapped


def test_long_names_wrap_or_fold_but_numbers_stay_whole():
    t = FitTable("a title " * 12, [Col("name", "left", wrap=True), Col("value ms"), Col("share")])
    t.add_row("x" * 90, "123456.789", "99.9%")
    t.add_row("image-cache-warm-2b · dohnuts-unshared · first-call", "0.001", "0.1%")
    for width in (80, 60, 30, 20):
        text = _render([t], width)
        _assert_fits(text, width)
        assert "123456.789" in text and "99.9%" in text and "0.001" in text


@pytest.mark.slow
def test_report_txt_is_full_width_and_the_console_fits(records, analysis, tmp_path):
    sections = [Section("efficiency", Group(*analysis_tables(analysis)), data=analysis.to_dict())]
    outputs = {}
    for width in (60, 80, 200):
        run_dir = tmp_path / str(width)
        run_dir.mkdir()
        console = Console(width=width, record=True, file=io.StringIO(), color_system=None)
        rows = summarize(records)
        write_summary(run_dir, summary_json(rows, sections))
        print_report(console, rows, sections, run_dir)
        shown = console.export_text().split("report: ")[0]  # not the paths of the files written
        if width < 200:
            _assert_fits(shown, width)
        outputs[width] = (shown, (run_dir / "report.txt").read_text(), (run_dir / "summary.json").read_text())

    report = outputs[80][1]
    # the same report.txt and summary.json whatever the console
    assert outputs[60][1:] == outputs[80][1:] == outputs[200][1:]
    assert "…" not in report
    lines = report.splitlines()
    widest = full_width([summary_table(summarize(records))])
    assert max(len(line) for line in lines) > 160  # the whole-call table of train-step at natural width
    # full tables: one header row with every column of the summary, one with every stage-table column
    assert any(all(h in line for h in ("workload", "target", "calls", "wall ms", "p10–p90", "spread",
                                       "decisions/s", "tokens/s", "peak mem")) for line in lines)
    assert any(all(h in line for h in ("workload", "target", "stage", "median ms", "share of wall"))
               for line in lines)
    assert any("limiter" in line and "bound ms" in line and "GFLOP" in line for line in lines)
    assert any("critical cycle" in line and line.count("vision → forward → backward → optimizer") == 3
               for line in lines)
    assert widest <= max(len(line) for line in lines)
    # everything the wide report shows is on the 80- and 60-column consoles too
    wide_numbers = _numbers(outputs[200][0])
    for width in (60, 80):
        assert not wide_numbers - _numbers(outputs[width][0])

    summary = json.loads(outputs[60][2])
    assert summary["summary"] == json.loads(json.dumps(summarize(records), default=str))
    assert summary["sections"]["efficiency"] == json.loads(json.dumps(analysis.to_dict(), default=str))
