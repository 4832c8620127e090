"""report.html carries every caveat report.txt carries: on a committed default CPU run (the 2-core
CI machine's baseline, measured while other sessions loaded it: busy-machine warnings, ceilings
that moved between their repeats, spreads too large for the claimed precision), each caveat of the text is on the page, worded the same, and as many of each."""

from __future__ import annotations

import re
import shutil
from html import unescape
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dohnuts.bench.cli import main

ROOT = Path(__file__).resolve().parents[2]
CPU_RUN = ROOT / "results" / "baselines" / "cpu-amd-epyc-2cores-1thread" / "run-1"  # `dohnuts-bench run`, default suite
BOX = re.compile(r"[\u2500-\u257f]")  # the tables' box-drawing characters


class _Marked(HTMLParser):
    """The text of every element that carries data-key, by key."""

    def __init__(self):
        super().__init__()
        self.by_key: dict[str, list[str]] = {}
        self.open: list[tuple[str, list[str] | None]] = []

    def handle_starttag(self, tag, attrs):
        key = dict(attrs).get("data-key")
        item = None
        if key is not None:
            item = [""]
            self.by_key.setdefault(key, []).append(item)
        self.open.append((tag, item))

    def handle_endtag(self, tag):
        while self.open:
            t, _ = self.open.pop()
            if t == tag:
                break

    def handle_data(self, data):
        for _, item in self.open:
            if item is not None:
                item[0] += data

    def texts(self, key: str) -> list[str]:
        return [" ".join(unescape(x[0]).split()) for x in self.by_key.get(key, [])]


def _flat(text: str) -> str:
    return " ".join(BOX.sub(" ", text).split())


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> tuple[str, _Marked]:
    tmp = tmp_path_factory.mktemp("caveats")
    run = tmp / "run"
    shutil.copytree(CPU_RUN, run)
    assert main(["analyze", str(run), "--out", str(tmp / "derived")]) == 0  # never into the run folder itself
    for name in ("summary.json", "report.txt"):  # the derived files a run's own analysis puts beside its records
        shutil.copy(tmp / "derived" / name, run / name)
    assert main(["report", str(run), "--html", "--store", str(tmp / "no-store.sqlite")]) == 0
    page = _Marked()
    page.feed((run / "report.html").read_text(encoding="utf-8"))
    return (run / "report.txt").read_text(encoding="utf-8"), page


def test_every_caveat_of_report_txt_is_on_the_page(reports):
    text, page = reports
    flat = _flat(text)
    caveats = page.texts("caveat")
    warnings = [c for c in caveats if c.startswith("warning: ")]
    # the run has these kinds: the machine's load, moved ceilings (its stages faster than their bound
    # were host-to-host "transfers", which have no bound on a CPU since the headline work; a bound
    # beaten everywhere is tests/bench/test_headline.py's case)
    assert any("other processes kept cores busy" in w for w in warnings)
    assert any("not stable: the bounds and efficiencies they set are uncertain" in w for w in warnings)
    assert sum("bound-suspect against" in w for w in warnings) == flat.count("bound-suspect against")
    for c in caveats:  # worded as the text words them (a note there sits in its workload · target's row)
        assert (c if c in warnings else c.split(": ", 1)[1]) in flat, c
    assert len(warnings) == flat.count("warning: ") > 0
    # each workload · target's note (spread too large for the claimed precision, overhead above 1 %)
    notes = page.texts("quality-note")
    assert [n for n in notes if n] and all(n in flat for n in notes)
    assert sum("over the median):" in n for n in notes) == flat.count("over the median):")
    assert sum("harness overhead above 1 %" in n for n in notes) == flat.count("harness overhead above 1 %")


def test_moved_ceilings_and_bound_suspect_verdicts_are_on_the_page(reports):
    text, page = reports
    stable = page.texts("ceiling-stable")
    assert stable.count("NO: moved") == text.count("NO: moved") > 0
    verdicts = page.texts("verdict")
    in_tables = sum(line.count("bound-suspect") for line in text.splitlines() if "│" in line)  # cells, not prose
    assert verdicts.count("bound-suspect") == in_tables
    # an efficiency above 100 % is never a number on the page
    efficiencies = [t for key, items in page.by_key.items() if key.startswith("efficiency.") for t in page.texts(key)]
    assert efficiencies and all(not t.endswith("%") or float(t[:-1]) <= 100.0 for t in efficiencies)


def test_the_machine_section_says_what_the_text_says(reports):
    text, page = reports
    from dohnuts.bench.analysis.headline import CPU_RUN_CANNOT, CPU_RUN_SHOWS

    flat = _flat(text)
    assert CPU_RUN_SHOWS in flat and CPU_RUN_CANNOT in flat
    html_loads = page.texts("others_cores")
    assert len(html_loads) == 23 and all(x in flat for x in html_loads)  # the load table, a row a group
