"""Built-in reporter: the run's plots, drawn from the sections the analysis hands over —
`roofline.png` from the efficiency section (each workload's stages against the roofs of its
precision: dohnuts.bench.analysis.roofline) and `scaling.png` from the scaling section (speedup
against process count: dohnuts.bench.analysis.scaling). It reads the sections' data alone, as a
third party's reporter would; the text report and summary.json are the harness's own
(dohnuts.bench.report.text_report and dohnuts.bench.analysis.summary, which `run` and `analyze`
call directly)."""

from __future__ import annotations

from dohnuts.bench.analysis.roofline import roofline_png_of
from dohnuts.bench.analysis.scaling import ScalingRow, scaling_png
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.report.status import log


@hookimpl
def dohnuts_bench_report(console, records, sections, run_dir):
    data: dict[str, dict] = {}
    for s in sections:  # the built-in analysis's sections come first
        data.setdefault(s.title, s.data or {})
    written = []
    if data.get("efficiency", {}).get("rooflines"):
        written.append(roofline_png_of(data["efficiency"], run_dir / "roofline.png"))
    if data.get("scaling", {}).get("rows"):
        written.append(scaling_png([ScalingRow(**row) for row in data["scaling"]["rows"]], run_dir / "scaling.png"))
    for path in written:
        if path is not None:
            log.info("wrote %s", path)
