"""Reading raw JSONL safely, grouping records, and the reports (rich tables, roofline PNG)."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from dohnuts.bench.analysis import (
    LoraShape, RecordError, RecordWarning, analyze_records, find_hwspec, print_analysis, read_records, roofline_png,
    stage_bound, stage_costs,
)
from dohnuts.bench.analysis.records import StageTime, record_from_dict, stage_ms, where
from dohnuts.config import preset
from dohnuts.runtime.work import WorkCounts
from tests.bench.test_bounds import _record

WORK = WorkCounts(sequences=3, seq_lens=(200, 230, 250), padded_len=122, prefix_len=128, candidates=9,
                  image_tokens=64, encoded_image_patches=(256,))
STAGES = {"prepare": 0.8, "h2d": 0.2, "vision": 1.5, "prefix": 1.0, "suffix": 2.5, "head": 0.05, "d2h": 0.02,
          "serialize": 0.3}


def _lines(n: int, **kw) -> list[str]:
    return [json.dumps(_record(WORK, STAGES, wall=7.0, model="tiny", iteration=i, **kw)) for i in range(n)]


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = _lines(3)
    path.write_text("\n".join(lines[:2]) + "\n" + lines[2][: len(lines[2]) // 2])  # killed mid-append
    with pytest.warns(RecordWarning, match=r"run.jsonl:3: skipped a truncated last line"):
        recs = read_records(path)
    assert [r.iteration for r in recs] == [0, 1]
    assert where(recs[0]) == f"{path}:1"


def test_other_schema_records_are_skipped_with_a_warning(tmp_path):
    path = tmp_path / "run.jsonl"
    other = json.loads(_lines(1)[0]) | {"schema": 3}
    path.write_text("\n".join([_lines(1)[0], json.dumps(other), "", _lines(2)[1]]) + "\n")
    with pytest.warns(RecordWarning, match=r"skipped 1 record\(s\) of schema 3 .*lines 2"):
        recs = read_records(path)
    assert len(recs) == 2 and all(r.schema == 2 for r in recs)  # (schema 1 on disk, migrated)


def test_a_corrupt_line_in_the_middle_is_an_error_with_its_line_number(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = _lines(3)
    lines[1] = lines[1][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RecordError, match=r"run.jsonl: field 'line 2': line 2 is not valid JSON"):
        read_records(path)


def test_missing_fields_and_inconsistent_counts_name_the_record(tmp_path):
    spec = find_hwspec("rx7900xtx")
    rec = json.loads(_lines(1)[0])
    del rec["work"]
    with pytest.raises(RecordError, match=r"run.jsonl:7: field 'work': is missing"):
        record_from_dict(rec, "run.jsonl:7")  # (as the reader reads line 7)
    bad = json.loads(_lines(1)[0])
    bad["work"]["padded_len"] = 5
    with pytest.raises(RecordError, match=r"run.jsonl:8: field 'work': padded_len=5"):
        analyze_records([record_from_dict(bad, "run.jsonl:8")], spec)
    mixed = [record_from_dict(json.loads(line)) for line in _lines(2)]
    mixed[1].precision = "fp32"
    with pytest.raises(RecordError, match="mixes precisions"):
        analyze_records(mixed, spec)


def test_device_time_is_preferred_over_host_time():
    assert stage_ms(StageTime(host_ms=5.0, device_ms=3.0)) == 3.0
    assert stage_ms(StageTime(host_ms=5.0, device_ms=None)) == 5.0


def test_groups_by_workload_and_target_and_renders(tmp_path):
    path = tmp_path / "run.jsonl"
    peer = [json.dumps(_record(WORK, {**STAGES, "suffix": 9.0}, wall=14.0, model="tiny", iteration=i,
                               target="transformers", device="NVIDIA H200")) for i in range(2)]
    path.write_text("\n".join(_lines(3, device="NVIDIA H200") + peer) + "\n")
    spec = find_hwspec("h200")
    analysis = analyze_records(read_records(path), spec)
    assert [(g.workload, g.target, g.calls) for g in analysis.groups] == [("w", "dohnuts", 3), ("w", "transformers", 2)]
    dohnuts, peer_group = analysis.groups
    assert dohnuts.bases == ("datasheet", "measured")
    suffix = {r.stage: r for r in dohnuts.stages}["suffix"]
    assert suffix.bound_ms["measured"] > suffix.bound_ms["datasheet"]  # measured ceilings are lower
    assert suffix.efficiency["measured"] > suffix.efficiency["datasheet"]
    m = dohnuts.call.measured
    assert m.max_ms <= m.critical_ms <= m.sum_ms
    assert peer_group.call.efficiency["datasheet"] < dohnuts.call.efficiency["datasheet"]

    console = Console(record=True, width=220)
    print_analysis(analysis, console)
    text = console.export_text()
    for word in ("NVIDIA H200", "suffix", "vision", "critical path", "transformers", "bandwidth", "compute"):
        assert word in text
    png = roofline_png(analysis, tmp_path / "plots" / "roofline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_a_cpu_run_or_another_device_is_flagged():
    spec = find_hwspec("rx7900xtx")
    rec = record_from_dict(json.loads(_lines(1, device="NVIDIA H200")[0]))
    assert "not one AMD Radeon RX 7900 XTX describes" in analyze_records([rec], spec).warnings[0]
    rec.device.name, rec.device.type = "cpu", "cpu"
    assert "CPU run" in analyze_records([rec], spec).warnings[0]


def test_a_stage_faster_than_its_lower_bound_is_flagged():
    rec = json.loads(_lines(1)[0])
    rec["stages"]["suffix"]["device_ms"] = 1e-9  # impossible: below any lower bound
    analysis = analyze_records([record_from_dict(rec)], find_hwspec("rx7900xtx"))
    (w,) = [w for w in analysis.warnings if "stage suffix" in w]
    assert "stage suffix is bound-suspect against its datasheet bound: measured 1e-09 ms, under its" in w
    assert "%" not in w  # the impossible efficiency is never written as a number
    suffix = next(r for r in analysis.groups[0].stages if r.stage == "suffix")
    assert suffix.efficiency["datasheet"] is None and suffix.verdict["datasheet"] == "bound-suspect"
    assert suffix.suspect["datasheet"].startswith("measured 1e-09 ms, under its")


def test_a_training_step_timed_as_one_forward_gets_the_bound_of_its_parts():
    micro = [WorkCounts(sequences=3, seq_lens=(200, 230, 250), padded_len=122, prefix_len=128, candidates=9)] * 4
    call = WorkCounts(sequences=12, seq_lens=micro[0].seq_lens * 4, padded_len=122, prefix_len=128, candidates=36,
                      train=True, microbatches=tuple(micro))
    stages = {"prepare": 1.0, "h2d": 0.1, "forward": 4.0, "backward": 8.0, "optimizer": 0.5}
    rec = _record(call, stages, wall=14.0, model="tiny") | {"target_options": {"lora_rank": 8}}
    spec = find_hwspec("rx7900xtx")
    g = analyze_records([record_from_dict(rec)], spec).groups[0]
    rows = {r.stage: r for r in g.stages}
    assert list(rows) == ["prepare", "h2d", "forward", "backward", "optimizer", "d2h"]
    assert all(r.modelled for n, r in rows.items() if n != "prepare")
    parts = stage_costs(preset("tiny"), call, lora=LoraShape(rank=8))
    flops = sum(parts[s].useful.total_flops for s in ("prefix", "suffix", "head"))
    assert sum(rows["forward"].useful_flops.values()) == pytest.approx(flops, rel=1e-12)
    assert rows["optimizer"].bound_ms["datasheet"] == stage_bound(parts["optimizer"], spec, "bf16").ms


def test_analysis_serialises_to_json():
    analysis = analyze_records([record_from_dict(json.loads(line)) for line in _lines(2)], find_hwspec("h200"))
    d = json.loads(json.dumps(analysis.to_dict()))
    assert d["groups"][0]["stages"][0]["stage"] == "prepare"
    assert d["groups"][0]["call"]["bound"]["measured"]["critical_ms"] > 0
    assert d["hwspec"]["ceilings"]["bf16_matmul_measured"]["provenance"] == "measured"


@pytest.mark.slow
def test_an_archived_run_reads_like_its_jsonl(tmp_path):
    """Committed runs are kept as results.jsonl.gz: read_records, `analyze DIR` and `compare` read it;
    a damaged archive is one error naming the file."""
    import gzip

    from dohnuts.bench.cli import main
    from dohnuts.errors import DohnutsError

    text = "\n".join(_lines(4)) + "\n"
    plain, packed = tmp_path / "plain" / "results.jsonl", tmp_path / "packed" / "results.jsonl.gz"
    plain.parent.mkdir()
    packed.parent.mkdir()
    plain.write_text(text)
    packed.write_bytes(gzip.compress(text.encode()))
    assert read_records(packed) == read_records(plain)
    # a real archived run (the committed CPU run at 1, 2 and 4 processes), analysed and compared
    import shutil
    from pathlib import Path

    run = tmp_path / "archived"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "cpu-gloo-4", run)
    assert main(["analyze", str(run), "--out", str(tmp_path / "report")]) == 0
    assert "Scaling" in (tmp_path / "report" / "report.txt").read_text()
    assert main(["compare", str(run), str(run)]) == 0
    bad = tmp_path / "bad.jsonl.gz"
    bad.write_bytes(gzip.compress(text.encode())[:40])
    with pytest.raises(DohnutsError, match="bad.jsonl.gz.*cannot be read"):
        read_records(bad)


def test_the_sustained_basis_is_bounded_by_the_sustained_matmul(tmp_path):
    """With a sustained matmul measured, a compute-bound call (2b, 32 × 512 tokens: text-2b) gets a
    third basis whose forward bound scales by burst / sustained against the measured basis (hand
    computation), and so does its whole-call efficiency."""
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    work = WorkCounts(sequences=32, seq_lens=(512,) * 32, padded_len=512, candidates=128)
    stages = {"prepare": 1.5, "h2d": 0.1, "forward": 84.0, "head": 0.02, "d2h": 0.03, "serialize": 0.4}
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(json.dumps(_record(work, stages, wall=86.0, iteration=i, device="NVIDIA H200"))
                              for i in range(3)) + "\n")
    spec = with_measured_ceilings(find_hwspec("h200"), {
        "bf16_matmul": {"value": 800e12, "kind": "compute"},
        "bf16_matmul_sustained": {"value": 640e12, "kind": "compute"}})
    g = analyze_records(read_records(path), spec).groups[0]
    assert g.bases == ("datasheet", "measured", "sustained")
    forward = {r.stage: r for r in g.stages}["forward"]
    assert forward.limiter["sustained"].startswith("compute")
    assert forward.bound_ms["sustained"] == pytest.approx(forward.bound_ms["measured"] * 800 / 640)
    assert g.call.efficiency["sustained"] == pytest.approx(g.call.efficiency["measured"] * 800 / 640)
    assert g.call.efficiency["sustained"] < 1.0
    console = Console(record=True, width=300)
    print_analysis(analyze_records(read_records(path), spec), console)
    assert "sustained" in console.export_text()


def test_a_shared_pass_timed_as_one_stage_gets_the_bound_of_prefix_and_suffix():
    """A call that runs its shared prefix and suffixes as one pass (stage `shared`, dohnuts'
    merged pass) is bounded by the prefix's and the suffixes' work together: the row holds their
    summed useful FLOPs and bytes, no prefix or suffix row remains, and the bound is at most the
    two bounds added (one roofline over the summed work) and at least the larger."""
    stages = {k: v for k, v in STAGES.items() if k not in ("prefix", "suffix")} | {"shared": 3.5}
    rec = _record(WORK, stages, wall=7.0, model="tiny")
    spec = find_hwspec("rx7900xtx")
    rows = {r.stage: r for r in analyze_records([record_from_dict(rec)], spec).groups[0].stages}
    assert "shared" in rows and not {"prefix", "suffix"} & set(rows)
    assert list(rows).index("vision") < list(rows).index("shared") < list(rows).index("head")
    parts = stage_costs(preset("tiny"), WORK)
    flops = sum(parts[s].useful.total_flops for s in ("prefix", "suffix"))
    assert sum(rows["shared"].useful_flops.values()) == pytest.approx(flops, rel=1e-12)
    alone = [stage_bound(parts[s], spec, "bf16").ms for s in ("prefix", "suffix")]
    assert max(alone) <= rows["shared"].bound_ms["datasheet"] <= sum(alone) * (1 + 1e-9)
    assert rows["shared"].measured_ms == 3.5
