"""An honest instrument: no impossible figure, and the answer first.

The default CPU run — `dohnuts-bench run`, the tiny standard suite, on the 2-core machine — is
committed (tests/bench/fixtures/cpu-standard-suite: run.json and the gzipped records,
`dohnuts-bench store archive`'s form) and analysed here as `dohnuts-bench analyze` does, so the
report files are those of a real run and the test takes seconds. Before this change that run's
report showed h2d efficiencies of 8,744 % to 18,069 % (a host-to-host "transfer" against a host
copy's bound); tests/bench/report_checks.py reads every table cell and every efficiency of
report.txt, report.html and summary.json back.

Synthetic variants of the same records cover what the run does not: ceilings far above what the
calls reached (every bound beaten: bound-suspect with the reason, never a number), and peers with
their fast paths (`extra.peer`, a fallback marked FALLBACK; records without it: "fast paths not
recorded"), a training peer beside dohnuts' train step, hostile strings in a peer's warning.
"""

from __future__ import annotations

import copy
import gzip
import json
import re
import shutil
from pathlib import Path

import pytest

from dohnuts.bench.analysis import analyze_records, read_jsonl, read_records
from dohnuts.bench.analysis.compare import compare_samples
from dohnuts.bench.analysis.headline import MEASUREMENT_ONLY, NO_PEER, NOT_RECORDED, PEER
from dohnuts.bench.analysis.hwspec import measured_hwspec
from dohnuts.bench.analysis.records import (
    LOCATION_KEY, group_key, per_call_records, record_from_dict, valid_records,
)
from dohnuts.bench.cli import main
from dohnuts.bench.commands.report import write_html
from dohnuts.schema import median
from tests.bench.report_checks import html_cells, impossible_figures, text_tables

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cpu-standard-suite"
PEER_RECORD = {"library": "transformers", "version": "5.17.0",
               "paths": {"delta_rule": "fla", "conv": "causal_conv1d", "attention": "sdpa", "norms": "torch"},
               "fallbacks": ["conv"],
               "messages": ["`causal_conv1d_fn` is falling back to its reference PyTorch implementation "
                            "[bold red]boom[/] \x1b[31m<script>alert(1)</script>"]}


def _records() -> list[dict]:
    """The committed run's records as plain values (a test changes them, then writes them)."""
    return [{k: v for k, v in r.items() if k != LOCATION_KEY} for r in read_jsonl(FIXTURE / "results.jsonl.gz")]


def _analyse(tmp: Path, records: list[dict] | None = None, ceiling_scale: float = 1.0) -> Path:
    """`dohnuts-bench analyze` of the committed run (or of `records`, with its run.json whose
    measured ceilings are multiplied by `ceiling_scale`), and the HTML page `run` writes."""
    src, out = tmp / "run", tmp / "out"
    src.mkdir()
    meta = json.loads((FIXTURE / "run.json").read_text())
    for c in meta["measured"]["ceilings"].values():
        c["value"] *= ceiling_scale
    (src / "run.json").write_text(json.dumps(meta))
    results = src / "results.jsonl.gz"
    if records is None:
        shutil.copy(FIXTURE / "results.jsonl.gz", results)
    else:
        with gzip.open(results, "wt") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
    assert main(["analyze", str(results), "--out", str(out)]) == 0
    shutil.copy(src / "run.json", out / "run.json")
    write_html(out, store=None)
    return out


def _files(out: Path) -> tuple[str, dict, str]:
    return ((out / "report.txt").read_text(), json.loads((out / "summary.json").read_text()),
            (out / "report.html").read_text())


@pytest.fixture(scope="module")
def default_run(tmp_path_factory) -> Path:
    return _analyse(tmp_path_factory.mktemp("default"))


def _steady_walls(records: list[dict]) -> dict[tuple[str, str], list[float]]:
    typed = [record_from_dict(r) for r in records]
    kept, _ = valid_records([r for r in per_call_records(typed) if r.phase == "steady"])
    out: dict[tuple[str, str], list[float]] = {}
    for r in kept:
        out.setdefault(group_key(r), []).append(r.wall_ms)
    return out


def _headline_rows(summary: dict) -> dict[tuple[str, str], dict]:
    return {(r["workload"], r["against"]["target"] if r["against"] else r["role"]): r
            for r in summary["sections"]["headline"]["rows"]}


# -- no impossible figure ---------------------------------------------------------------------------

def test_the_default_cpu_run_shows_no_efficiency_above_100_percent(default_run):
    assert impossible_figures(default_run) == []
    # ... and the checker does see efficiencies: every modelled stage's and call's, as numbers
    text, summary, html = _files(default_run)
    effs = [g["call"]["efficiency"]["measured"] for g in summary["sections"]["efficiency"]["groups"]]
    assert effs and all(e is not None and 0 < e <= 1 for e in effs)
    assert f"{100 * effs[0]:.1f}%" in text and f"{100 * effs[0]:.1f}%" in html


def test_on_a_cpu_h2d_and_d2h_are_no_transfers_and_have_no_bound(default_run):
    """Host and device memory are one on a CPU: the h2d / d2h stages copy nothing, so no host-link
    bound applies (the run measured 0.0006 ms against a 0.109 ms "bound"); on a GPU they keep it."""
    text, summary, _ = _files(default_run)
    transfers = [s for g in summary["sections"]["efficiency"]["groups"] for s in g["stages"]
                 if s["stage"] in ("h2d", "d2h")]
    assert len(transfers) >= 2 * 7
    for s in transfers:
        assert not s["modelled"] and s["unbounded"] == "not a transfer"
        assert s["bound_ms"] == {"measured": 0.0} and s["efficiency"] == {"measured": None}
        assert s["verdict"] == {"measured": None} and s["suspect"] == {}
    rows = [line for line in text.splitlines() if re.match(r"│ (h2d|d2h) +│", line) and "not a transfer" in line]
    assert len(rows) == len(transfers)

    records = _records()
    meta = json.loads((FIXTURE / "run.json").read_text())
    spec = measured_hwspec("x86_64", meta["measured"]["ceilings"])
    gpu = copy.deepcopy([r for r in records if r["workload"]["name"] == "text" and r["target"] == "dohnuts"
                         and r["phase"] == "steady"])
    for r in gpu:
        r["device"]["type"] = "cuda"
    (g,) = analyze_records([record_from_dict(r) for r in gpu], spec).groups
    h2d = next(s for s in g.stages if s.stage == "h2d")
    assert h2d.modelled and h2d.bound_ms["measured"] > 0 and h2d.unbounded == ""
    assert h2d.limiter["measured"] == "bandwidth (host_copy_this_run)"


def test_a_bound_the_calls_beat_reads_bound_suspect_with_its_reason_everywhere(tmp_path):
    """Ceilings 10^4 times what this CPU measured: every modelled stage and every call beats its
    bound. No efficiency is then shown as a number — text, HTML, summary.json — only bound-suspect
    and why."""
    out = _analyse(tmp_path, ceiling_scale=1e-4)
    assert impossible_figures(out) == []
    text, summary, html = _files(out)
    groups = summary["sections"]["efficiency"]["groups"]
    for g in groups:
        c = g["call"]
        assert c["efficiency"] == {"measured": None} and c["verdict"] == {"measured": "bound-suspect"}
        assert re.fullmatch(r"measured [\d.e+-]+ ms, under its [\d.e+-]+ ms lower bound \(critical path\): the "
                            r"bound is wrong .*", c["suspect"]["measured"])
        for s in g["stages"]:
            if s["modelled"] and sum(s["useful_flops"].values()) > 0:
                assert s["efficiency"] == {"measured": None} and "lower bound" in s["suspect"]["measured"]
    # report.txt: the efficiency cells of every stage and call table say bound-suspect
    tables = text_tables(text)
    effs = [row[k] for t in tables if not t["title"].startswith("Headline")
            for k, h in enumerate(t["headers"]) if h.startswith("eff") for row in t["rows"]]
    # ("0.0%": a stage modelled with no work, e.g. vision when every image came from the cache)
    assert effs and set(effs) <= {"bound-suspect", "—", "0.0%"} and effs.count("bound-suspect") > len(groups)
    calls = [row[1] for t in tables for row in t["rows"] if row and row[0].startswith("efficiency (critical-path")]
    assert len(calls) == len(groups) and set(calls) == {"bound-suspect"}
    assert text.count("is bound-suspect against its measured bound: measured") >= len(groups)
    # the headline: bound-suspect, with the reason below the table
    (head,) = [t for t in tables if t["title"].startswith("Headline")]
    k = head["headers"].index("efficiency (measured bound)")
    assert {row[k] for row in head["rows"]} <= {"bound-suspect", "″"}
    assert re.search(r"^bound-suspect: text · dohnuts \(measured basis\): measured .* lower bound", text, re.M)
    for r in summary["sections"]["headline"]["rows"]:
        assert r["dohnuts"]["efficiency"] is None and r["dohnuts"]["verdict"] == "bound-suspect"
        assert r["dohnuts"]["suspect"] == next(g["call"]["suspect"]["measured"] for g in groups
                                               if (g["workload"], g["target"]) == (r["workload"], "dohnuts"))
    # report.html: each efficiency cell says bound-suspect and carries the reason
    page = html_cells(html)
    shown = [text for key, _, text in page.keyed if key.startswith("efficiency.") or key.endswith("efficiency")]
    assert shown and {t.strip() for t in shown} == {"bound-suspect"}
    assert html.count('class="n suspect" title="measured ') > len(groups)


# -- the headline first ------------------------------------------------------------------------------

def test_the_headline_is_the_first_table_of_report_txt_and_report_html(default_run):
    text, summary, html = _files(default_run)
    assert text.startswith("Headline: dohnuts against its peer and against the measured bound")
    tables = text_tables(text)
    assert tables[0]["title"].startswith("Headline") and tables[1]["title"].startswith("Measured calls")
    # what a CPU run can and cannot show comes with the headline, before the detail, and only there
    lines = text.splitlines()
    for words in ("This is a CPU run", "A CPU run shows:", "It cannot show:"):
        (at,) = [k for k, line in enumerate(lines) if line.startswith(words)]
        assert tables[0]["end"] < at < tables[1]["start"]
    assert text.index("This run's machine") > tables[-1]["start"] - 200
    page = html_cells(html)
    assert page.table_ids[0] == "headline" and page.table_ids[1] == "summary"
    assert html.index("This is a CPU run") < html.index("<table id='summary'")
    assert html.count("<svg class=\"chart headline\"") == 1
    assert html.index("chart headline") < html.index("<table id='summary'")
    assert summary["sections"]["headline"]["cpu"]["cannot"].startswith("It cannot show: anything about a GPU")


def test_the_headline_numbers_are_those_of_the_run(default_run):
    """Each comparison's ratio is the other target's median over dohnuts' (the records'), its
    interval compare's bootstrap of those samples; the efficiency is the analysis' whole call."""
    text, summary, html = _files(default_run)
    walls = _steady_walls(_records())
    rows = _headline_rows(summary)
    assert [(w, r["role"]) for (w, _), r in rows.items()] == [
        ("image-cache-cold", NO_PEER), ("image-cache-warm", NO_PEER), ("image", NO_PEER),
        ("shared-prefix", PEER), ("shared-prefix", MEASUREMENT_ONLY), ("text", PEER), ("train-step", NO_PEER)]
    assert rows[("shared-prefix", "dohnuts-unshared (measurement-only)")]["fast_paths"] == "—"
    efficiency = {(g["workload"], g["target"]): g["call"] for g in summary["sections"]["efficiency"]["groups"]}
    page = html_cells(html)
    shown = {(key, group): t.strip() for key, group, t in page.keyed}
    (head,) = [t for t in text_tables(text) if t["title"].startswith("Headline")]
    for (workload, other), r in rows.items():
        d = r["dohnuts"]
        assert d["wall_ms"] == pytest.approx(median(walls[(workload, "dohnuts")]))
        call = efficiency[(workload, "dohnuts")]
        assert d["efficiency"] == call["efficiency"]["measured"] and d["verdict"] == call["verdict"]["measured"]
        assert shown[("headline.efficiency", f"{workload}|dohnuts")] == f"{100 * d['efficiency']:.1f}%"
        if r["role"] == NO_PEER:
            assert r["speedup"] is None and r["against"] is None
            continue
        mine, theirs = walls[(workload, "dohnuts")], walls[(workload, other)]
        sp = r["speedup"]
        assert sp["ratio"] == pytest.approx(median(theirs) / median(mine), rel=1e-12)
        c = compare_samples(f"{workload}\0{other}", mine, theirs)
        assert (sp["low"], sp["high"]) == (c.ci_low, c.ci_high) and sp["low"] <= sp["ratio"] <= sp["high"]
        assert r["against"]["efficiency"] == efficiency[(workload, other)]["efficiency"]["measured"]
        assert shown[("headline.speedup", f"{workload}|{other}")] == f"{sp['ratio']:.2f}×"
        assert shown[("headline.interval", f"{workload}|{other}")] == f"{sp['low']:.2f}–{sp['high']:.2f}"
        (line,) = [row for row in head["rows"] if row[:2] == [workload, other]]
        assert line[7] == f"{sp['ratio']:.2f}× ({sp['low']:.2f}–{sp['high']:.2f})"
        assert line[9] == (NOT_RECORDED if r["role"] == PEER else "—")


def _with_peers(records: list[dict]) -> list[dict]:
    """The committed run's records, with the text peer's fast paths recorded (conv fell back) and
    two training peers beside dohnuts' train step: 1.5× and 2× its calls, the second without
    `extra.peer`."""
    out = []
    for r in records:
        if r["workload"]["name"] == "text" and r["target"] == "transformers":
            r = copy.deepcopy(r)
            r.setdefault("extra", {})["peer"] = PEER_RECORD
        out.append(r)
        if r["workload"]["name"] == "train-step" and r["target"] == "dohnuts" and r["phase"] == "steady":
            for label, factor, peer in (("transformers+peft", 1.5, PEER_RECORD | {"fallbacks": [], "messages": []}),
                                        ("transformers+peft (checkpointing)", 2.0, None)):
                twin = copy.deepcopy(r)
                twin.update(target=label, target_name="transformers", wall_ms=r["wall_ms"] * factor)
                twin["extra"] = {k: v for k, v in twin["extra"].items()} | ({"peer": peer} if peer else {})
                out.append(twin)
    return out


def test_peers_their_fast_paths_and_fallbacks_in_text_html_and_json(tmp_path):
    out = _analyse(tmp_path, _with_peers(_records()))
    assert impossible_figures(out) == []
    text, summary, html = _files(out)
    rows = _headline_rows(summary)
    # a training peer per target label, each against dohnuts' own train step
    peft, checkpointing = rows[("train-step", "transformers+peft")], rows[("train-step", "transformers+peft (checkpointing)")]
    assert peft["role"] == checkpointing["role"] == PEER
    assert peft["speedup"]["ratio"] == pytest.approx(1.5) and checkpointing["speedup"]["ratio"] == pytest.approx(2.0)
    assert peft["fast_paths"] == "transformers 5.17.0: delta_rule fla · conv causal_conv1d · attention sdpa · norms torch"
    assert checkpointing["fast_paths"] == NOT_RECORDED and rows[("shared-prefix", "transformers")]["fast_paths"] == NOT_RECORDED
    # the fallback is marked FALLBACK: JSON (the headline and the peer's summary row), text, HTML
    tf = rows[("text", "transformers")]
    assert tf["peer"]["status"] == {"delta_rule": "ok", "conv": "FALLBACK", "attention": "ok", "norms": "ok"}
    assert "conv causal_conv1d FALLBACK" in tf["fast_paths"]
    (row,) = [r for r in summary["summary"] if (r["workload"], r["target"]) == ("text", "transformers")]
    assert row["peer"] == tf["peer"] and row["peer"]["fallbacks"] == ["conv"]
    assert all(r["peer"] is None for r in summary["summary"] if r["target"].startswith("dohnuts"))
    (head,) = [t for t in text_tables(text) if t["title"].startswith("Headline")]
    (line,) = [r for r in head["rows"] if r[:2] == ["text", "transformers"]]
    assert "conv causal_conv1d FALLBACK" in line[9]
    cells = {(k, g): t for k, g, t in html_cells(html).keyed}
    assert "conv causal_conv1d FALLBACK" in " ".join(cells[("headline.fast_paths", "text|transformers")].split())
    assert "conv causal_conv1d <span class='flag'>FALLBACK</span>" in html
    # the library's own warning, once, as text: no markup read, no control character, escaped in HTML
    assert text.count("peer fallback: transformers: `causal_conv1d_fn` is falling back") == 1
    assert "[bold red]boom[/] \\x1b[31m<script>" in text and "\x1b" not in text
    assert "<script>alert" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_a_peer_that_leaves_its_gpu_idle_while_it_holds_a_core_is_named_host_bound(tmp_path):
    """transformers+peft: GPU 34 % busy, 0.99 of a core → host-bound, in JSON, text and HTML; the
    checkpointing peer keeps its GPU 92 % busy (not), and the text peer holds 0.3 of a core (not)."""
    def telemetry(util: float, own: float) -> list[dict]:
        return [{"load": {"own_cores": own, "others_cores": 0.0, "cpus": 16}, "nvml": {"gpu_util_percent": util}}] * 3

    records = _with_peers(_records())
    for r in records:
        if r["phase"] == "steady":
            util, own = {"transformers+peft": (34, 0.99), "transformers+peft (checkpointing)": (92, 0.99),
                         "transformers": (40, 0.3)}.get(r["target"], (None, None))
            if util is not None:
                r["telemetry"] = telemetry(util, own)
    out = _analyse(tmp_path, records)
    text, summary, html = _files(out)
    (said,) = summary["sections"]["headline"]["host_bound"]
    assert said.startswith("transformers+peft on train-step kept its GPU 34 % busy while its process kept 0.99 cores")
    assert f"host-bound peer: {said[:40]}" in " ".join(text.split())
    assert f"host-bound peer: {said[:40]}" in html
    # the CPU run's records carry no GPU utilisation: no peer is named
    (tmp_path / "cpu").mkdir()
    assert _files(_analyse(tmp_path / "cpu", _with_peers(_records())))[1]["sections"]["headline"]["host_bound"] == []


def test_a_malformed_peer_record_is_one_line_naming_the_field(tmp_path, capsys):
    records = _records()
    bad = next(r for r in records if r["target"] == "transformers" and r["phase"] == "steady")
    bad["extra"] = {"peer": {"library": "transformers", "paths": ["fla"]}}
    src = tmp_path / "results.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert main(["analyze", str(src), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"results\.jsonl:\d+: field 'extra\.peer\.paths'", err[0]), err


@pytest.mark.parametrize("width", [80, 40])
def test_the_headline_fits_a_narrow_console_and_keeps_every_number(width):
    """The headline is a FitTable like every other table (dohnuts.bench.analysis.render): on a narrow
    console it splits with the workload and the compared target repeated, then stacks; no number
    is cut and each comparison stays named."""
    import io

    from rich.console import Console

    from dohnuts.bench.analysis.headline import build_headline, headline_renderables

    meta = json.loads((FIXTURE / "run.json").read_text())
    records = read_records(FIXTURE / "results.jsonl.gz")
    headline = build_headline(records, analyze_records(records, measured_hwspec("x86_64", meta["measured"]["ceilings"])),
                              meta["measured"])

    def render(w: int) -> str:
        console = Console(width=w, record=True, file=io.StringIO(), color_system=None)
        for part in headline_renderables(headline):
            console.print(part)
        return console.export_text()

    wide, narrow = render(400), render(width)
    assert max(len(line) for line in narrow.splitlines()) <= width and "…" not in narrow
    numbers = re.compile(r"\d+\.\d+[×%]?")
    assert sorted(numbers.findall(wide)) == sorted(numbers.findall(narrow))
    if width == 80:  # split: each part keyed by workload and the compared target
        assert narrow.count("┏") > 1 and narrow.count("(measurement-only)") == narrow.count("┏")


def test_the_figure_checker_reads_a_sign_and_still_flags_an_efficiency_over_100():
    """A negative overlap (a stream slower per request than the single call, as on a loaded CPU) is
    a possible figure; 104 % efficiency is not. The checker tells them apart by the sign."""
    from tests.bench.report_checks import percents

    assert percents("overlap -104% · efficiency 104 % · 1,250.5%") == [-104.0, 104.0, 1250.5]
