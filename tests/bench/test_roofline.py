"""One roofline drawing (dohnuts.bench.analysis.roofline) for the run's PNG and report.html's panels:
both draw the roofs summary.json records (`sections.efficiency.rooflines`, the hwspec's matrix and
vector roofs per basis, each meeting that basis' memory bandwidth), from the same stage points; the
page's SVG is inline and self-contained; names a user chose reach the figure as plain text."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import dohnuts.bench.analysis.roofline as roofline
from dohnuts.bench.analysis import analyze_records, find_hwspec, read_records
from dohnuts.bench.analysis.hwspec import with_measured_ceilings
from dohnuts.bench.cli import main

ROOT = Path(__file__).resolve().parents[2]
H200_RUN = ROOT / "tests" / "bench" / "fixtures" / "h200-ab-after"  # a committed H200 run (datasheet + measured)


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    run = tmp_path_factory.mktemp("roof") / "run"
    shutil.copytree(H200_RUN, run)
    return run


def test_the_png_and_the_page_draw_the_same_roofs(analysed, monkeypatch, tmp_path):
    drawn: list[tuple[str, list, list]] = []
    real = roofline.figure

    def spy(panels, roof_list, title, **kw):
        drawn.append((kw.get("canvas", "agg"), roof_list, [p for ps in panels.values() for p in ps]))
        return real(panels, roof_list, title, **kw)

    monkeypatch.setattr(roofline, "figure", spy)
    assert main(["analyze", str(analysed), "--out", str(tmp_path / "analysis")]) == 0  # never into the run folder
    shutil.copy(tmp_path / "analysis" / "summary.json", analysed / "summary.json")  # as a run's own analysis puts it
    assert main(["report", str(analysed), "--html"]) == 0
    summary = json.loads((analysed / "summary.json").read_text())["sections"]["efficiency"]
    meta = json.loads((analysed / "run.json").read_text())
    spec = with_measured_ceilings(find_hwspec("h200"), meta["measured"]["ceilings"])
    (precision,) = summary["rooflines"]
    assert summary["rooflines"][precision] == roofline.roofs(spec, precision)
    bases = {r["basis"] for r in summary["rooflines"][precision]}
    assert {"datasheet", "measured"} <= bases and {r["role"] for r in summary["rooflines"][precision]} == {
        "matrix", "vector"}
    png = [d for d in drawn if d[0] == "agg"]
    page = [d for d in drawn if d[0] == "svg"]
    assert len(png) == 1 and len(page) >= len({g["workload"] for g in summary["groups"]})
    assert all(roofs == png[0][1] for _, roofs, _ in page)  # the very roofs of the PNG, in every panel
    steady = [p for _, _, points in page for p in points if "first-call" not in p[0]]
    assert sorted(steady) == sorted(png[0][2])  # and its points
    html = (analysed / "report.html").read_text()
    assert html.count('class="chart roofline"') == len(page)
    for roof in summary["rooflines"][precision]:  # each roof named on the page (its legend)
        assert f"{roof['role']} roof: {roof['peak']}" in html
    assert "url(" not in html and "<clipPath" not in html and "<metadata" not in html


def test_a_roof_is_min_of_peak_and_bandwidth_at_its_vertices():
    xs, ys = roofline.roof_vertices(peak=1e15, memory=4e12, lo=0.1, hi=1e4, ylo=1e9)
    assert xs == [0.1, 250.0, 1e4] and ys == [4e11, 1e15, 1e15]
    xs, ys = roofline.roof_vertices(peak=1e15, memory=4e12, lo=1e-6, hi=1e4, ylo=1e9)
    assert xs[0] == pytest.approx(2.5e-4) and ys[0] == pytest.approx(1e9)  # starts where it rises above ylo


def test_user_named_strings_reach_the_figure_as_plain_text(tmp_path):
    records = read_records(H200_RUN / "results.jsonl.gz")[:40]
    name = "$\\frac{1}{<b>x</b>$\x1b[31m"
    for r in records:
        r.workload.name = name
    analysis = analyze_records(records, find_hwspec("h200"))
    png = roofline.roofline_png(analysis, tmp_path / "roofline.png")  # mathtext would raise on this name
    assert png.read_bytes()[:4] == b"\x89PNG"
    data = analysis.to_dict()
    (points,) = roofline.stage_points(data["groups"]).values()
    svg = roofline.roofline_svg(points, next(iter(data["rooflines"].values())), name)
    assert "\x1b" not in svg and "<b>" not in svg and "&lt;b&gt;" in svg and "\\x1b[31m" in svg
    assert svg.startswith('<svg class="chart roofline" role="img" aria-label="$\\frac{1}{&lt;b&gt;x')


def test_a_summary_without_roofs_says_so():
    from dohnuts.bench.report.html_page import _rooflines

    assert "holds no roofs" in _rooflines([], None)


def test_a_decade_is_labelled_as_plain_text_and_nothing_else_is():
    assert [roofline.decade_label(v) for v in (1.0, 10.0, 1e3, 1e15, 0.01, 1e-12)] == [
        "10⁰", "10¹", "10³", "10¹⁵", "10⁻²", "10⁻¹²"]
    assert [roofline.decade_label(v) for v in (2.0, 5e3, 0.0, -10.0, float("nan"))] == ["", "", "", "", ""]


def test_the_axes_label_their_decades_as_text_without_mathtext(recwarn):
    """Every decade the axes span is one plain `<text>` of the page's SVG (no mathtext's glyph-by-glyph
    groups), and the PNG draws the superscripts without a missing glyph."""
    roofs = [{"basis": "datasheet", "role": "matrix", "peak": "bf16_matmul", "peak_flops": 1e15, "memory": "hbm",
              "memory_bytes_s": 4e12}]
    svg = roofline.roofline_svg([("dohnuts", "mlp", 100.0, 3e14)], roofs, "w")
    for exponent in range(5):  # x: 1/4 … 4·10⁴
        assert f">10{str(exponent).translate(roofline.SUPERSCRIPTS)}<" in svg, exponent
    for exponent in range(12, 16):  # y: down to the memory roof at x = 1/4, up to twice the peak
        assert f">10{str(exponent).translate(roofline.SUPERSCRIPTS)}<" in svg, exponent
    assert "mathdefault" not in svg and "DejaVuSans-Oblique" not in svg
    fig = roofline.figure({"w": [("dohnuts", "mlp", 100.0, 3e14)]}, roofs, "w")
    import io

    fig.savefig(io.BytesIO(), format="png")
    assert not [w for w in recwarn if "missing from font" in str(w.message) or "Glyph" in str(w.message)]
