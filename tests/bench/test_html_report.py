"""The HTML report (`dohnuts-bench report RUN --html`) in a real headless browser: Debian's
`chromium` loads the page offline with no console message, the script runs (the body is marked
ready), the charts render as SVG with their shapes, and the numbers the page shows are those of
summary.json. A screenshot of the page is left in the test's temporary folder for a person to look
at. Skipped only where no chromium is installed (`.ci/run` installs it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from dohnuts.bench.cli import main

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "bench" / "fixtures"  # committed H200 runs (gzipped JSONL and run.json): fixtures/README.md
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_browser = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on this machine (.ci/run installs it)")


def _browser(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Headless chromium on `page` with networking off; its console goes to stderr as
    INFO:CONSOLE lines."""
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-extensions",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=3000", *extra, page.as_uri()]
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


class _Keys(HTMLParser):
    """The elements of a DOM that carry data-key: (key, group, text)."""

    def __init__(self):
        super().__init__()
        self.found: list[list[str]] = []
        self.open: list[list[str] | None] = []
        self.body_ready = False
        self.svgs = 0
        self.shapes = 0
        self.tables: list[str] = []  # the tables' ids, in page order

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body" and a.get("data-ready") == "1":
            self.body_ready = True
        if tag == "table":
            self.tables.append(a.get("id") or a.get("class") or "")
        if tag == "svg":
            self.svgs += 1
        if tag in ("circle", "polyline", "line", "path"):
            self.shapes += 1
        if tag in ("td", "b", "span"):
            item = [a["data-key"], a.get("data-group", ""), ""] if "data-key" in a else None
            self.open.append(item)
            if item:
                self.found.append(item)

    def handle_endtag(self, tag):
        if tag in ("td", "b", "span") and self.open:
            self.open.pop()

    def handle_data(self, data):
        for item in self.open:
            if item is not None:
                item[2] += data


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """The report of a committed H200 run against the one before it, with both in a store."""
    tmp = tmp_path_factory.mktemp("html")
    runs = tmp / "runs"
    for name in ("ab-before", "ab-after"):
        shutil.copytree(FIXTURES / f"h200-{name}", runs / name)
        assert main(["analyze", str(runs / name), "--out", str(tmp / name)]) == 0  # never into the run folder
        shutil.copy(tmp / name / "summary.json", runs / name / "summary.json")  # as a run's own analysis puts it
    store = tmp / "store.sqlite"
    assert main(["store", "import", str(runs / "ab-before"), str(runs / "ab-after"), "--store", str(store)]) == 0
    assert main(["report", str(runs / "ab-after"), "--html", "--against", str(runs / "ab-before"),
                 "--store", str(store)]) == 0
    page = runs / "ab-after" / "report.html"
    summary = json.loads((runs / "ab-after" / "summary.json").read_text())
    return tmp, page, summary


def test_the_page_is_self_contained(report):
    """Nothing on the page is fetched from anywhere: no external script, style, font or image."""
    _, page, _ = report
    html = page.read_text()
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)
    assert "@import" not in html and "url(" not in html


@needs_browser
def test_the_page_loads_renders_and_shows_the_summary_numbers(report):
    tmp, page, summary = report
    done = _browser(page, tmp, "--dump-dom")
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line]
    assert console == [], console  # no error, no warning, no log from the page
    dom = _Keys()
    dom.feed(done.stdout)
    assert dom.body_ready, "the page's script did not run to its end"
    workloads = {r["workload"] for r in summary["summary"]}
    assert dom.svgs >= len(workloads)  # a roofline panel a workload at least, and the trend charts
    assert dom.shapes > 10
    shown = {(key, group): text.strip() for key, group, text in dom.found}
    checked = 0
    for r in summary["summary"]:
        group = f"{r['workload']}|{r['target']}"
        wall = float(shown[("wall_median_ms", group)])
        assert wall == pytest.approx(r["wall_median_ms"], rel=1e-3, abs=1e-3)
        assert float(shown[("decisions_per_s", group)]) == pytest.approx(r["decisions_per_s"], abs=0.051)
        energy = r.get("energy_j_per_call")
        assert shown[("energy_j_per_call", group)] == ("no energy counter" if energy is None else f"{energy:.3g} J")
        checked += 1
    assert checked == len(summary["summary"]) > 0
    for g in summary["sections"]["efficiency"]["groups"]:
        group = f"{g['workload']}|{g['target']}"
        for base in g.get("bases") or []:
            value, suspect = g["call"]["efficiency"].get(base), g["call"]["suspect"].get(base)
            text = shown[(f"efficiency.{base}", group)]
            assert text == ("bound-suspect" if suspect else "—" if value is None else f"{100 * value:.1f}%")
    # the headline opens the page: its first table, every number that of summary.json
    assert dom.tables[0] == "headline"
    rows = summary["sections"]["headline"]["rows"]
    assert rows
    for r in rows:
        d, sp = r["dohnuts"], r["speedup"]
        group = f"{r['workload']}|{d['target']}"
        assert float(shown[("headline.wall_ms", group)]) == pytest.approx(d["wall_ms"], abs=0.006)
        assert shown[("headline.efficiency", group)] == (
            "bound-suspect" if d["suspect"] else f"{100 * d['efficiency']:.1f}%")
        if sp is not None:
            pair = f"{r['workload']}|{r['against']['target']}"
            assert shown[("headline.speedup", pair)] == f"{sp['ratio']:.2f}×"
            assert shown[("headline.interval", pair)] == f"{sp['low']:.2f}–{sp['high']:.2f}"
    assert "comparison" in done.stdout and "No history in the run store" not in done.stdout


@needs_browser
def test_a_screenshot_of_the_page(report):
    """The page paints (a screenshot a person can look at: tmp/.../report.png)."""
    tmp, page, _ = report
    shot = tmp / "report.png"
    done = _browser(page, tmp, f"--screenshot={shot}", "--window-size=1280,2400", "--hide-scrollbars")
    assert done.returncode == 0 and shot.is_file(), done.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000  # a blank page compresses to a few KB
