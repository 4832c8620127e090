"""A user's string on display (issue 47): names with rich markup (`text [/x]`) or terminal escape
sequences (clear screen, clipboard write) reach the terminal and report.txt as text only, through
`run`, `analyze`, `compare`, `history` and `calibrate` alike (dohnuts.bench.report.terminal); a string that
becomes a link in report.html is one only when its scheme is allowed (html_report.link_href)."""

from __future__ import annotations

import ast
import io
import json
import shutil
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from tests.bench.test_bench_safety import _small_ceiling_benchmarks  # noqa: F401 (autouse: short ceilings)

ROOT = Path(__file__).resolve().parents[2]
CLEAR = "\x1b[2J\x1b[H"                 # clear the screen, cursor home
CLIPBOARD = "\x1b]52;c;cm0gLXJmIH4=\x07"  # OSC 52: write the clipboard
HOSTILE_NAMES = ["text [/x]", f"evil{CLEAR}{CLIPBOARD}[bold red]x\u202e"]  # markup; escapes, BEL, a bidi override
WORKLOAD = """\
kind: text
name: {name}
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 2
halfwidth: 0
shape: {{requests: 1, questions: 1, seq_tokens: 64, candidates: 2, candidate_tokens: 2}}
"""


def _clean(text: str) -> None:
    """Nothing that acts on a terminal: no ESC, BEL or bidi override, raw."""
    for bad in ("\x1b", "\x07", "\u202e", "\x9b"):
        assert bad not in text, (bad, text[:300])


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> tuple[Path, str, str]:
    """One run of two workloads with hostile names: (run folder, its stdout, its stderr)."""
    import contextlib
    import sys

    tmp = tmp_path_factory.mktemp("hostile-names")
    files = []
    for k, name in enumerate(HOSTILE_NAMES):
        path = tmp / f"w{k}.yaml"
        path.write_text(WORKLOAD.format(name=json.dumps(name)))
        files.append(str(path))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["run", *files, "--out", str(tmp / "runs")])
        sys.stdout.flush()
    assert code == 0, err.getvalue()[-2000:]
    (run,) = (tmp / "runs").iterdir()
    return run, out.getvalue(), err.getvalue()


def test_run_with_markup_and_escapes_in_names_reports_them_as_text(hostile_run):
    """`text [/x]` once made `run` measure, then crash with no summary or report; escape sequences in a
    name reached the terminal and report.txt unfiltered."""
    run, out, err = hostile_run
    assert (run / "summary.json").is_file() and (run / "report.html").is_file()
    report = (run / "report.txt").read_text()
    for text in (out, err, report):
        _clean(text)
    assert "text [/x]" in out and "text [/x]" in report
    assert "evil\\x1b[2J" in report and "[bold red]x" in report  # shown, escaped, never interpreted
    names = {r["workload"] for r in json.loads((run / "summary.json").read_text())["summary"]}
    assert names == set(HOSTILE_NAMES)  # the data keeps the names exactly


def test_analyze_compare_and_history_print_hostile_names_as_text(hostile_run, tmp_path, capsys):
    run, _, _ = hostile_run
    capsys.readouterr()
    assert main(["analyze", str(run), "--out", str(tmp_path / "a")]) == 0
    assert main(["compare", str(run), str(run), "--json", str(tmp_path / "c.json")]) == 0
    store = tmp_path / "store.sqlite"
    assert main(["store", "import", str(run), "--store", str(store)]) == 0
    assert main(["history", "--store", str(store), "--tables", "--json", str(tmp_path / "h.json")]) == 0
    captured = capsys.readouterr()
    _clean(captured.out)
    _clean(captured.err)
    _clean((tmp_path / "a" / "report.txt").read_text())
    assert captured.out.count("text [/x]") >= 3  # analyze, compare, history each printed it


def test_calibrate_prints_a_hostile_hwspec_name_as_text(tmp_path, monkeypatch, capsys):
    """calibrate with a hwspec named `text [/x]` once crashed on the name read as markup."""
    import dohnuts.bench.commands.calibrate as calibrate

    spec = tmp_path / "card.yaml"
    text = (ROOT / "hwspecs" / "rx7900xtx.yaml").read_text()
    spec.write_text(text.replace("name: AMD Radeon RX 7900 XTX", f"name: {json.dumps('card [/x] ' + CLEAR)}", 1))
    monkeypatch.setattr(calibrate, "measure", lambda device, console: {
        "bf16_matmul": {"value": 1e12, "kind": "compute", "unit": "FLOP/s", "method": "stub", "date": "2026-12-04"}})
    assert main(["calibrate", "--hwspec", str(spec), "--write", str(tmp_path / "out.yaml")]) == 0
    captured = capsys.readouterr()
    _clean(captured.out)
    _clean(captured.err)
    assert "card [/x]" in captured.out


def test_a_progress_bar_takes_a_hostile_description_as_text():
    from rich.progress import Progress

    from dohnuts.bench.report.terminal import SafeConsole, progress_text_column

    console = SafeConsole(file=io.StringIO(), force_terminal=True, width=100)
    with Progress(progress_text_column(), console=console) as bar:
        bar.add_task(f"text [/x] · {CLEAR}", total=2)
    shown = console.file.getvalue()
    assert "text [/x]" in shown and "\\x1b[2J\\x1b[H" in shown and "\x1b[2J" not in shown  # (\x1b[2K: the bar's own)


def test_every_console_of_the_bench_is_a_safe_console():
    """The class closed, not the case: no module of dohnuts/bench builds a rich Console of its own, and
    no string the bench prints is markup."""
    for path in sorted((ROOT / "dohnuts" / "bench").rglob("*.py")):
        if path.name == "terminal.py":
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "Console":
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} builds a Console: use SafeConsole")
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "from_markup":
                raise AssertionError(f"{path.relative_to(ROOT)}:{node.lineno} reads markup")


@pytest.mark.parametrize("target, linked", [
    ("traces/text-dohnuts.json.gz", True), ("https://example.org/t.json.gz", True), ("file:///tmp/t.json.gz", True),
    ("javascript:alert(1)", False), ("JaVaScRiPt:alert(1)", False), (" javascript:alert(1)", False),
    ("java\tscript:alert(1)", False), ("\x01javascript:alert(1)", False), ("data:text/html,<script>x</script>", False),
    ("vbscript:msgbox", False), ("//evil.example/x", False), ("\\\\evil\\share", False),
])
def test_only_an_allowed_scheme_becomes_a_link_in_html(target, linked):
    from dohnuts.bench.report.html_page import link, link_href

    assert (link_href(target) is not None) == linked
    html = link(target, "w · t", key="trace")
    assert ("<a " in html) == linked and "javascript:" not in (link_href(target) or "")


def test_a_javascript_trace_path_in_run_json_is_text_on_the_page(hostile_run, tmp_path):
    """report.html once turned a run.json `traces[].path` of `javascript:…` into a live link."""
    from dohnuts.bench.commands.report import write_html

    run, _, _ = hostile_run
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    meta = json.loads((copy / "run.json").read_text())
    meta["traces"] = [{"workload": "w", "target": "t", "calls": 3, "path": "javascript:alert(document.cookie)"},
                      {"workload": "w", "target": "u", "calls": 3, "path": "traces/w-u.json.gz"}]
    (copy / "run.json").write_text(json.dumps(meta))
    (copy / "report.html").unlink()
    page = write_html(copy).read_text()
    assert "href='javascript" not in page.lower() and 'href="javascript' not in page.lower()
    assert "javascript:alert(document.cookie): not a link" in page and "href='traces/w-u.json.gz'" in page
