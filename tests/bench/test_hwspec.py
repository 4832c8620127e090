"""Hardware specs: the built-in numbers, their derivation check, and every bad-input error."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dohnuts.bench.analysis.hwspec import (
    BUILTIN_DIR, REQUIRED_ROLES, ROLES, find_hwspec, hwspec_for_device, load_hwspec,
)
from dohnuts.errors import ConfigError


def test_rx7900xtx_matches_the_seed_derivation():
    spec = find_hwspec("rx7900xtx")
    bf16 = spec.ceiling("matrix", "bf16")
    assert bf16.name == "bf16_matrix" and bf16.provenance == "derived"
    assert dict(bf16.factors) == {"compute_units": 96, "clock_hz": 2.5e9, "flops_per_clock_per_cu": 512}
    assert bf16.value == 96 * 2.5e9 * 512 == 122.88e12
    assert bf16.target(spec.target_fraction) == 98.304e12
    mem = spec.ceiling("memory", "bf16")
    assert mem.value == 960e9 and mem.target(spec.target_fraction) == 768e9
    vec = spec.ceiling("vector", "bf16")
    assert vec.provenance == "datasheet" and vec.value == pytest.approx(61.44e12, rel=0)
    link = spec.ceiling("host_link", "bf16")  # PCIe 4.0 x16, theoretical, per direction
    assert link.value == pytest.approx(16e9 * 16 * 128 / 130 / 8) and 31e9 < link.value < 32e9
    assert spec.ceiling("matrix", "fp32").name == "fp32_vector"  # no FP32 matrix unit
    assert not spec.has_measured("bf16") and spec.overlap_compute_kinds is False
    assert spec.matches("AMD Radeon RX 7900 XTX") and not spec.matches("NVIDIA H200")


def test_h200_datasheet_and_measured_ceilings_are_labelled():
    spec = find_hwspec("h200")
    ds = spec.ceiling("matrix", "bf16", "datasheet")
    assert (ds.value, ds.provenance, ds.factors) == (989e12, "datasheet", ())
    assert spec.ceiling("memory", "bf16").value == 4.8e12
    assert spec.ceiling("vector", "bf16").value == 67e12
    measured = spec.ceiling("matrix", "bf16", "measured")
    assert (measured.value, measured.provenance, measured.date) == (763e12, "measured", "2026-11-30")
    copy = spec.ceiling("memory", "bf16", "measured")
    assert (copy.value, copy.provenance) == (4.28e12, "measured")
    # Roles nobody measured fall back to the datasheet ceiling.
    assert spec.ceiling("vector", "bf16", "measured").name == "fp32_vector"
    assert spec.ceiling("host_link", "bf16", "measured").value == pytest.approx(32e9 * 16 * 128 / 130 / 8)
    assert spec.has_measured("bf16") and spec.overlap_compute_kinds is True


def _minimal() -> dict:
    return {
        "name": "Test GPU",
        "ceilings": {
            "mm": {"kind": "compute", "provenance": "derived", "source": "test",
                   "factors": {"units": 10, "clock_hz": "2e9", "flops_per_clock": 100}},
            "mem": {"kind": "bandwidth", "provenance": "datasheet", "source": "test", "value": 1e12},
            "link": {"kind": "bandwidth", "provenance": "derived", "source": "test",
                     "factors": {"rate": "16e9", "lanes": 16, "code": "128/130", "bytes_per_bit": "1/8"}},
        },
        "roles": {"bf16": {"matrix": "mm", "attention": "mm", "scan": "mm", "vector": "mm", "memory": "mem",
                           "host_link": "link"}},
    }


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_user_device_loads_and_derives_products(tmp_path):
    spec = load_hwspec(_write(tmp_path, _minimal()))
    assert spec.ceiling("matrix", "bf16").value == 10 * 2e9 * 100
    assert spec.ceiling("host_link", "bf16").value == pytest.approx(16e9 * 16 * 128 / 130 / 8)
    assert spec.source.endswith("gpu.yaml") and spec.target_fraction == 0.8


def test_stated_value_within_tolerance_is_accepted_and_the_product_wins(tmp_path):
    data = _minimal()
    data["ceilings"]["mm"]["value"] = 2.0019e12  # 0.095% above 2e12
    assert load_hwspec(_write(tmp_path, data)).ceiling("matrix", "bf16").value == 2e12


def _error(tmp_path, data) -> ConfigError:
    path = _write(tmp_path, data)
    with pytest.raises(ConfigError) as info:
        load_hwspec(path)
    err = info.value
    assert err.source == str(path) and str(path) in str(err), "the error must name the file"
    return err


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["ceilings"]["mm"].update(value=2.01e12), "ceilings.mm.value"),  # 0.5% off its factors
    (lambda d: d["ceilings"]["mem"].update(value=0), "ceilings.mem.value"),
    (lambda d: d["ceilings"]["mem"].update(value=-1e12), "ceilings.mem.value"),
    (lambda d: d["ceilings"]["mm"]["factors"].update(clock_hz=0), "ceilings.mm.factors.clock_hz"),
    (lambda d: d["ceilings"]["mm"]["factors"].update(clock_hz="fast"), "ceilings.mm.factors.clock_hz"),
    (lambda d: d["ceilings"]["mem"].pop("value"), "ceilings.mem.value"),  # neither value nor factors
    (lambda d: d["ceilings"]["mm"].update(provenance="datasheet", factors=None), "ceilings.mm.value"),
    (lambda d: d["ceilings"]["mem"].update(provenance="derived"), "ceilings.mem.factors"),
    (lambda d: d["ceilings"]["mem"].update(provenance="measured"), "ceilings.mem.date"),
    (lambda d: d["ceilings"]["mem"].update(provenance="rumour"), "ceilings.mem.provenance"),
    (lambda d: d["ceilings"]["mem"].update(kind="speed"), "ceilings.mem.kind"),
    (lambda d: d["ceilings"]["mem"].pop("source"), "ceilings.mem.source"),
    (lambda d: d["ceilings"]["mem"].update(colour="red"), "ceilings.mem.colour"),
    (lambda d: d.pop("ceilings"), "ceilings"),
    (lambda d: d["roles"]["bf16"].pop("memory"), "roles.bf16.memory"),  # a missing ceiling
    (lambda d: d["roles"]["bf16"].update(memory="hbm"), "roles.bf16.memory"),  # an undefined one
    (lambda d: d["roles"]["bf16"].update(memory="mm"), "roles.bf16.memory"),  # compute for bandwidth
    (lambda d: d["roles"]["bf16"].update(tensor="mm"), "roles.bf16.tensor"),
    (lambda d: d.update(measured_roles={"bf16": {"matrix": "mm"}}), "measured_roles.bf16.matrix"),
    (lambda d: d.update(measured_roles={"fp8": {}}), "measured_roles.fp8"),
    (lambda d: d.update(target_fraction=1.5), "target_fraction"),
    (lambda d: d.update(overlap_compute_kinds="yes"), "overlap_compute_kinds"),
    (lambda d: d.update(flops=1), "flops"),
    (lambda d: d.pop("name"), "name"),
])
def test_bad_specs_name_file_and_field(tmp_path, mutate, field):
    data = _minimal()
    mutate(data)
    err = _error(tmp_path, data)
    assert err.field == field and f"field '{field}'" in str(err)


def test_measured_ceiling_needs_and_keeps_its_date(tmp_path):
    data = _minimal()
    data["ceilings"]["mm_measured"] = {"kind": "compute", "provenance": "measured", "value": 1.5e12,
                                       "date": "2026-11-30", "source": "8192³ matmul"}
    data["measured_roles"] = {"bf16": {"matrix": "mm_measured"}}
    spec = load_hwspec(_write(tmp_path, data))
    assert spec.ceiling("matrix", "bf16", "measured").value == 1.5e12
    assert spec.ceiling("matrix", "bf16", "datasheet").value == 2e12


def test_unreadable_and_unknown_specs(tmp_path):
    with pytest.raises(ConfigError, match="neither a file nor a built-in"):
        find_hwspec("no-such-gpu")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_hwspec(bad)


def test_every_builtin_spec_loads_and_fills_every_role():
    files = sorted(BUILTIN_DIR.glob("*.yaml"))
    assert {f.stem for f in files} >= {"rx7900xtx", "h100", "h200"}
    for f in files:
        spec = load_hwspec(f)
        for precision in spec.precisions():
            for role in ROLES:
                if role in REQUIRED_ROLES or spec.has_role(role, precision):
                    assert spec.ceiling(role, precision).value > 0
        for c in spec.ceilings.values():
            assert c.source, f"{f.name}: {c.name} has no source"


@pytest.mark.parametrize("device, spec", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("AMD Radeon RX 7900 XTX", "rx7900xtx"),
    ("NVIDIA H100 PCIe", None), ("NVIDIA A100-SXM4-80GB", None), ("cpu", None)])
def test_a_run_without_hwspec_takes_the_builtin_its_device_names_match(device, spec):
    # the PCIe H100 (114 SMs, HBM2e at 2 TB/s) is another device: no spec rather than the SXM card's
    found = hwspec_for_device(None, device)
    assert (found and Path(found.source).stem) == spec
    assert found is None or found.matches(device)


def test_the_h100_datasheet_ceilings():
    spec = find_hwspec("h100")
    assert spec.overlap_compute_kinds  # Hopper: tensor cores and FP32 pipes apart, as the H200's spec
    assert spec.ceiling("matrix", "bf16").value == 989e12 and spec.ceiling("memory", "bf16").value == 3.35e12
    assert spec.ceiling("host_link", "bf16").value == pytest.approx(32e9 * 16 * 128 / 130 / 8)
    assert spec.ceiling("matrix", "bf16", "measured").provenance == "measured"


def test_readme_documents_every_field():
    from typing import get_args

    import msgspec

    from dohnuts.bench.analysis.hwspec_file import CeilingFile, HwSpecFile

    text = (BUILTIN_DIR / "README.md").read_text()
    (provenances,) = [get_args(f.type) for f in msgspec.structs.fields(CeilingFile) if f.name == "provenance"]
    for key in sorted({*HwSpecFile.__struct_fields__, *CeilingFile.__struct_fields__}) + list(ROLES) + list(provenances):
        assert re.search(rf"`{key}`", text), f"hwspecs/README.md does not document `{key}`"


def test_ceilings_measured_at_run_start_take_the_measured_roles():
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    run = {"bf16_matmul": {"value": 700e12, "kind": "compute", "method": "8192³", "date": "2027-01-02"},
           "device_copy": {"value": 4.1e12, "kind": "bandwidth", "method": "2 GiB copy"},
           "h2d_pinned": {"value": 50e9, "kind": "bandwidth"}, "d2h_pinned": {"value": 53e9, "kind": "bandwidth"},
           "broken": {"value": 1.0}, "nan_copy": {"value": float("nan")}}
    spec = with_measured_ceilings(find_hwspec("h200"), run)
    assert spec.ceiling("matrix", "bf16", "measured").value == 700e12  # replaces the file's 763e12
    assert spec.ceiling("matrix", "bf16", "measured").date == "2027-01-02"
    assert spec.ceiling("memory", "fp32", "measured").value == 4.1e12
    assert spec.ceiling("host_link", "bf16", "measured").value == 53e9  # the faster direction
    assert spec.ceiling("matrix", "bf16", "datasheet").value == 989e12  # datasheet untouched
    assert spec.ceiling("matrix", "fp32", "measured").name == "fp32_vector"  # a BF16 matmul says nothing of FP32
    rx = with_measured_ceilings(find_hwspec("rx7900xtx"), {"bf16_matmul": {"value": -1.0},
                                                           "device_copy": {"value": 800e9, "kind": "bandwidth"}})
    assert rx.has_measured("bf16") and rx.ceiling("matrix", "bf16", "measured").name == "bf16_matrix"
    assert rx.ceiling("memory", "bf16", "measured").value == 800e9


def test_a_sustained_matmul_adds_the_sustained_basis():
    """`bf16_matmul_sustained` (the matmul run back to back under the power limit) bounds matrix,
    attention and scan work on a third basis; its other roles are the measured basis's, and the
    measured basis keeps the burst number. Without it, or with a broken value, there is no such basis."""
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    burst = {"value": 777e12, "kind": "compute", "date": "2026-11-30"}
    copy = {"value": 4.2e12, "kind": "bandwidth"}
    spec = with_measured_ceilings(find_hwspec("h200"), {
        "bf16_matmul": burst, "device_copy": copy,
        "bf16_matmul_sustained": {"value": 672e12, "kind": "compute", "method": "2 s", "date": "2026-11-30"}})
    assert spec.bases("bf16") == ("datasheet", "measured", "sustained")
    assert spec.bases("fp32") == ("datasheet", "measured")  # a BF16 matmul says nothing of FP32
    for role in ("matrix", "attention", "scan"):
        assert spec.ceiling(role, "bf16", "sustained").value == 672e12
        assert spec.ceiling(role, "bf16", "measured").value == 777e12
    assert spec.ceiling("memory", "bf16", "sustained").value == 4.2e12  # from the measured basis
    assert spec.ceiling("vector", "bf16", "sustained").name == "fp32_vector"  # then the datasheet
    assert spec.has_role("interconnect", "bf16", "sustained")  # the datasheet's NVLink
    assert "2 s" in spec.ceiling("matrix", "bf16", "sustained").source
    for run in ({"bf16_matmul": burst}, {"bf16_matmul": burst, "bf16_matmul_sustained": {"value": 0.0}},
                {"bf16_matmul_sustained": {"value": 6e14, "kind": "bandwidth"}}):
        assert with_measured_ceilings(find_hwspec("h200"), run).bases("bf16") == ("datasheet", "measured")
    with pytest.raises(ValueError, match="unknown basis"):
        spec.ceiling("matrix", "bf16", "burst")


@pytest.mark.parametrize("device,overlap", [
    ({"type": "cpu", "name": "x86_64"}, False),  # one thread runs matrix and vector work in turn
    ({"type": "cuda", "name": "NVIDIA H100 PCIe", "capability": "9.0", "hip": None}, True),
    ({"type": "cuda", "name": "NVIDIA A100-SXM4-80GB", "capability": "8.0", "hip": None}, True),
    ({"type": "cuda", "name": "NVIDIA GeForce RTX 4090", "capability": "8.9", "hip": None}, True),
    ({"type": "cuda", "name": "Tesla P100-PCIE-16GB", "capability": "6.0", "hip": None}, False),  # no tensor cores
    ({"type": "cuda", "name": "AMD Instinct MI300X", "capability": "9.4", "hip": "6.4", "arch": "gfx942:sramecc+:xnack-"},
     True),  # CDNA: matrix cores beside the vector ALUs
    ({"type": "cuda", "name": "AMD Radeon RX 7800 XT", "capability": "11.0", "hip": "6.4", "arch": "gfx1101"},
     False),  # RDNA 3: WMMA on the SIMDs, as rx7900xtx.yaml says
    ({"type": "cuda", "name": "AMD Radeon RX 9070 XT", "capability": "12.0", "hip": "6.4", "arch": "gfx1201"}, False),
    ({"type": "cuda", "name": "a GPU"}, True),  # no capability recorded: the bound that holds on any GPU
    (None, False), ({}, False),
])
def test_a_synthesised_spec_sums_compute_kinds_only_where_the_device_shares_their_units(device, overlap):
    from dohnuts.bench.analysis.hwspec import compute_kinds_overlap

    assert compute_kinds_overlap(device) is overlap
    for name in ("h100", "h200"):  # the datasheet specs of the kinds of GPU the rule answers True for
        assert find_hwspec(name).overlap_compute_kinds
    assert not find_hwspec("rx7900xtx").overlap_compute_kinds


def test_a_synthesised_specs_compute_bound_is_the_maximum_or_the_sum_of_the_kinds_by_hand():
    """2 TFLOP of matrix work at 500 TFLOP/s (4 ms) and 0.3 TFLOP of vector work at 50 TFLOP/s
    (6 ms), 1 GB through 2 TB/s memory (0.5 ms): 6 ms with the kinds maximised, 10 ms added."""
    from dohnuts.bench.analysis.bounds import work_bound
    from dohnuts.bench.analysis.cost import Work
    from dohnuts.bench.analysis.hwspec import measured_hwspec

    run = {"bf16_matmul": {"value": 500e12}, "fp32_vector": {"value": 50e12}, "device_copy": {"value": 2e12},
           "h2d_pinned": {"value": 50e9}}
    work = Work({"linear": 2e12, "elementwise": 0.3e12}, device_bytes=1e9)
    side_by_side = measured_hwspec("NVIDIA A100-SXM4-80GB", run, overlap_compute_kinds=True)
    shared = measured_hwspec("x86_64", run)
    assert side_by_side.overlap_compute_kinds and not shared.overlap_compute_kinds
    assert "maximised" in side_by_side.description and "added" in shared.description
    for spec, ms in ((side_by_side, 6.0), (shared, 10.0)):
        bound = work_bound(work, spec, "bf16", basis="measured")
        assert bound.ms == pytest.approx(ms) and bound.terms_ms["matrix"] == pytest.approx(4.0)
        assert bound.limiter == "compute" and bound.ceiling == "fp32_vector_this_run"


def test_a_run_no_datasheet_describes_is_bounded_on_its_devices_model(main_job_run):
    """Analysed without a spec, the committed H100 reference (recorded before hwspecs/h100.yaml)
    maximises the kinds as the H100 spec does — its text calls' measured and sustained bounds are
    the H100 spec's — and says so; the README's main job on this CPU adds them and says so."""
    import json

    from dohnuts.bench.analysis.records import read_records
    from dohnuts.bench.analysis.run_sections import run_sections

    run = Path(__file__).resolve().parents[2] / "results" / "h100" / "2026-12-07-s52-fresh-suite"
    records = [r for r in read_records(run / "results.jsonl.gz") if r.workload.name == "text"]
    measured = json.loads((run / "run.json").read_text())["measured"]

    def efficiency(spec):
        (section,) = [s for s in run_sections(records, spec, measured) if s.title == "efficiency"]
        return section

    alone, h100 = efficiency(None), efficiency(find_hwspec("h100"))
    assert alone.data["hwspec"]["overlap_compute_kinds"] and "maximised" in str(alone.renderable.renderables[0])
    for basis, ms in (("measured", 54.54), ("sustained", 61.19)):  # 66.2 % and 74.3 % of its 82.39-ms median
        bounds = [{g["target"]: g["call"]["bound"][basis]["critical_ms"] for g in s.data["groups"]} for s in (alone, h100)]
        assert bounds[0]["dohnuts"] == pytest.approx(bounds[1]["dohnuts"], rel=1e-9), basis
        assert bounds[0]["dohnuts"] == pytest.approx(ms, abs=0.01), basis
    (report,) = (main_job_run / "runs" / "bench").glob("*/report.txt")
    assert "matrix and vector time added (their units shared)" in report.read_text()


def test_a_synthesised_spec_has_the_sustained_basis_its_run_measured_and_the_faster_host_link():
    from dohnuts.bench.analysis.hwspec import measured_hwspec

    run = {"bf16_matmul": {"value": 780e12}, "fp32_fma": {"value": 60e12}, "device_copy": {"value": 2.9e12},
           "h2d_pinned": {"value": 53.7e9}, "d2h_pinned": {"value": 55.1e9}}
    plain = measured_hwspec("GPU", run, overlap_compute_kinds=True)
    assert plain.bases("bf16") == ("measured",) and plain.ceiling("host_link", "bf16", "measured").value == 55.1e9
    for broken in ({"value": float("nan")}, {"value": -1.0}, {"value": True}, "695e12"):
        assert measured_hwspec("GPU", run | {"bf16_matmul_sustained": broken}).bases("bf16") == ("measured",)
    spec = measured_hwspec("GPU", run | {"bf16_matmul_sustained": {"value": 695e12, "method": "2 s back to back"}},
                           overlap_compute_kinds=True)
    assert spec.bases("bf16") == ("measured", "sustained") and spec.bases("fp32") == ()  # no FP32 matmul measured
    assert spec.ceiling("matrix", "bf16", "sustained").value == 695e12
    assert spec.ceiling("vector", "bf16", "sustained").value == 60e12  # the roles it leaves out: the measured ones
    assert spec.ceiling("matrix", "bf16", "measured").value == 780e12
