"""One validity rule for both vendors, on the same scenarios, from recorded library responses.

NVML (an H200) and amdsmi (an RX 7900 XTX) are replayed from tests/bench/fixtures/ — responses in
the shapes and units each library documents (vendor_replay.py) — through the real samplers, the
telemetry thread and the runner's record: power-capped dense work is kept and counted, thermal
throttling is excluded, a low clock that no power cap explains is excluded, an idle GPU is fine.
Each record also gets the energy of its call from the vendor's energy counter, each sampler reads
the process's own GPU (by PCI address) and describes it for provenance.
"""

from __future__ import annotations

import copy
import io
import sys
from types import SimpleNamespace

import pytest
import torch

from dohnuts.bench.analysis.measurement_quality import validity_summary
from dohnuts.bench.analysis.records import Energy, Validity, check_reportable, valid_records
from dohnuts.bench.measure.telemetry import NO_ENERGY_COUNTER, TelemetryThread
from dohnuts_bench_plugins.telemetry import AmdSmiSampler, NvmlSampler, dohnuts_bench_register_telemetry
from tests.bench.test_validity import GpuStateTarget, _measure
from tests.bench.vendor_replay import AmdSmiReplay, NvmlReplay

# vendor → (replay, sampler, module name, clock label, maximum clock, PCI address of device 1, power limit W)
VENDORS = {
    "nvml": (NvmlReplay, NvmlSampler, "pynvml", "SM", 1980, "0000:2a:00", 700.0),
    "amdsmi": (AmdSmiReplay, AmdSmiSampler, "amdsmi", "GFX", 2500, "0000:43:00", 355.0),
}
THERMAL = ("thermal", "temp_", "hotspot", "hw_slowdown")  # the names a thermal or hardware slowdown goes by
SCENARIOS = ("clean", "power-capped", "thermal", "low-clock-no-cap", "idle")


def _replay(monkeypatch, vendor: str, scenarios: list[str], data=None):
    replay_cls, sampler_cls, module = VENDORS[vendor][:3]
    replay = replay_cls(scenarios, data)
    monkeypatch.setitem(sys.modules, module, replay)
    return replay


def _walk(replay):
    """A call through the scenario's three samples: one stage per sample, each sampled."""
    def apply(step):
        replay.step = step
    return apply


def _call_records(tmp_path, monkeypatch, vendor, scenarios, pci=None):
    """One measured call per scenario, on device 1 of a two-GPU machine (device 0 idles)."""
    records = {}
    for i, scenario in enumerate(scenarios):
        replay = _replay(monkeypatch, vendor, ["idle", scenario])
        sampler = VENDORS[vendor][1](1, pci)
        assert sampler.unavailable is None
        telemetry = TelemetryThread([sampler])
        replay.step = 0
        rec = _measure(tmp_path, GpuStateTarget(telemetry, _walk(replay)), telemetry, [0, 1, 2], iteration=i)
        records[scenario] = (rec, replay)
    return records


@pytest.mark.parametrize("vendor", VENDORS)
def test_one_rule_for_both_vendors(tmp_path, monkeypatch, vendor):
    name, label, top = vendor, VENDORS[vendor][3], VENDORS[vendor][4]
    records = _call_records(tmp_path, monkeypatch, vendor, SCENARIOS)
    v = {s: rec.validity for s, (rec, _) in records.items()}
    for rec, _ in records.values():
        check_reportable(rec)
        assert rec.validity.gpu_samples == 3
    # clean and idle: valid, nothing capped
    assert v["clean"] == Validity(valid=True, reasons=[], detail=[], gpu_samples=3)
    assert v["idle"] == Validity(valid=True, reasons=[], detail=[], gpu_samples=3)
    # dense work at the power limit, its clock below 0.9 × max: kept and counted
    capped_clocks = [w[name][f"{label.lower()}_clock_mhz"] for w in records["power-capped"][0].telemetry]
    assert max(capped_clocks) < 0.9 * top
    assert v["power-capped"] == Validity(valid=True, reasons=[], detail=[], gpu_samples=3, power_capped=3)
    # thermal: excluded, and said so by a thermal reason
    assert v["thermal"].valid is False
    assert any(r.startswith(f"{name}: throttled (") and any(t in r for t in THERMAL) for r in v["thermal"].reasons)
    # a low clock no power cap explains: excluded for its clock alone
    assert v["low-clock-no-cap"].reasons == [f"{name}: {label} clock below 0.9 × max {top} MHz"]
    assert v["low-clock-no-cap"].detail == [f"{capped_low(records, name, label)} MHz in 3/3 samples"]

    kept, dropped = valid_records([rec for rec, _ in records.values()])
    assert dropped == 2 and [r.iteration for r in kept] == [0, 1, 4]
    summary = validity_summary([rec for rec, _ in records.values()])[("w", "fake")]
    assert (summary["n"], summary["invalid"], summary["power_capped"]) == (5, 2, 1)


def capped_low(records, name, label) -> str:
    clocks = [w[name][f"{label.lower()}_clock_mhz"] for w in records["low-clock-no-cap"][0].telemetry]
    return f"{min(clocks):g}–{max(clocks):g}"


@pytest.mark.parametrize("vendor", VENDORS)
def test_energy_of_a_call_from_the_vendor_counter(tmp_path, monkeypatch, vendor):
    records = _call_records(tmp_path, monkeypatch, vendor, ["power-capped", "idle"])
    for scenario, (rec, replay) in records.items():
        expected = replay.energy_j(1, 2) - replay.energy_j(1, 0)  # the counter over the call's window
        assert rec.energy.source == vendor and rec.energy.reason is None
        assert rec.energy.joules == pytest.approx(expected, rel=1e-9)
    # two 100 ms intervals at the power limit (NVML: 690 W; amdsmi: 355 W) and at idle
    power = {"nvml": 690, "amdsmi": 355}[vendor]
    assert records["power-capped"][0].energy.joules == pytest.approx(2 * 0.1 * power, rel=0.01)
    assert records["idle"][0].energy.joules < 0.25 * records["power-capped"][0].energy.joules


@pytest.mark.parametrize("vendor", VENDORS)
def test_energy_counter_unavailable_is_said(tmp_path, monkeypatch, vendor):
    replay_cls = VENDORS[vendor][0]
    data = copy.deepcopy(replay_cls([SCENARIOS[0]] * 2).data)
    key = {"nvml": "nvmlDeviceGetTotalEnergyConsumption", "amdsmi": "amdsmi_get_energy_count"}[vendor]
    for samples in data["scenarios"].values():
        for sample in samples:
            sample[key] = {"raises": "not supported (a virtual machine guest, or a GPU before Volta)"}
    replay = _replay(monkeypatch, vendor, ["clean", "clean"], data)
    sampler = VENDORS[vendor][1](0)
    telemetry = TelemetryThread([sampler])
    rec = _measure(tmp_path, GpuStateTarget(telemetry, _walk(replay)), telemetry, [0, 1])
    assert rec.energy.joules is None and rec.energy.source == vendor
    assert "energy counter unavailable" in rec.energy.reason and "not supported" in rec.energy.reason
    assert rec.validity.valid is True  # the rest of the telemetry still works
    assert sampler.device_facts()["energy_counter"].startswith("unavailable")


def test_energy_on_a_cpu_run(tmp_path):
    telemetry = TelemetryThread([])
    rec = _measure(tmp_path, GpuStateTarget(telemetry, lambda state: None), telemetry, [0])
    assert rec.energy == Energy(joules=None, source=None, reason=NO_ENERGY_COUNTER)
    check_reportable(rec)


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_sampler_reads_the_process_own_gpu_by_pci_address(monkeypatch, vendor):
    """With HIP_VISIBLE_DEVICES=1 (or CUDA_VISIBLE_DEVICES=1) torch's device 0 is the machine's
    second GPU; the vendor library still lists both. The PCI address finds the right one."""
    pci = VENDORS[vendor][5]
    label = VENDORS[vendor][3].lower()
    _replay(monkeypatch, vendor, ["clean", "thermal"])
    mine = VENDORS[vendor][1](0, pci)  # torch's index 0, the GPU at PCI ...:2a/43:00
    assert mine.device_match == f"PCI {pci}"
    assert mine.sample()["throttling"]  # device 1 replays the thermal scenario
    by_index = VENDORS[vendor][1](0)  # no PCI address from torch: the index, with a note
    assert by_index.device_match.startswith("index 0 (torch gave no PCI address")
    assert by_index.sample()[f"{label}_clock_mhz"] > 0.9 * VENDORS[vendor][4]
    nowhere = VENDORS[vendor][1](0, "0000:99:00")
    assert nowhere.device_match.startswith("index 0 (no device at PCI 0000:99:00")


@pytest.mark.parametrize("vendor", VENDORS)
def test_device_facts_for_provenance(monkeypatch, vendor):
    _replay(monkeypatch, vendor, ["clean", "clean"])
    facts = VENDORS[vendor][1](1, VENDORS[vendor][5]).device_facts()
    assert facts["power_limit_w"] == VENDORS[vendor][6]
    assert facts["vendor"] == {"nvml": "nvidia", "amdsmi": "amd"}[vendor]
    assert facts["energy_counter"] == "available" and facts["device_match"] == f"PCI {VENDORS[vendor][5]}"
    if vendor == "nvml":
        assert facts["driver_version"] == "570.124.06" and facts["max_sm_clock_mhz"] == 1980
        assert facts["max_mem_clock_mhz"] == 3201 and facts["pci_bus_id"] == "00000000:2A:00.0"
    else:
        assert facts["driver_version"] == "6.10.5" and facts["amdsmi_version"] == "26.0.2"
        assert facts["compute_units"] == 96
        assert facts["max_gfx_clock_mhz"] == 2500 and facts["max_mem_clock_mhz"] == 1249
        assert facts["gfx_target"] == "gfx1100" and facts["name"] == "AMD Radeon RX 7900 XTX"
        # amdsmi_get_temp_metric documents millidegrees: read as °C
        assert facts["temperature_limits_c"] == {"temperature_edge": 100, "temperature_hotspot": 110,
                                                 "temperature_mem": 100}


@pytest.mark.parametrize("scenario, throttlers, valid", [
    ("power-capped (bit mask)", ["ppt0"], True), ("thermal (bit mask)", ["temp_hotspot"], False)])
def test_amd_throttler_bits_when_the_binding_returns_the_mask(tmp_path, monkeypatch, scenario, throttlers, valid):
    records = _call_records(tmp_path, monkeypatch, "amdsmi", [scenario])
    rec = records[scenario][0]
    reading = rec.telemetry[1]["amdsmi"]
    assert reading["throttlers"] == throttlers and reading["throttle_source"] == "indep_throttle_status"
    assert rec.validity.valid is valid
    if valid:
        assert reading["power_capped"] == ["ppt0"] and rec.validity.power_capped == 3
    else:
        assert "amdsmi: throttled (temp_hotspot)" in rec.validity.reasons


@pytest.mark.parametrize("vendor", VENDORS)
def test_the_hook_samples_torch_current_device(monkeypatch, vendor):
    """The registered sampler is built on torch's current device, found by its PCI address: rank k
    of a multi-GPU run records its own GPU, not GPU 0."""
    _replay(monkeypatch, vendor, ["clean", "thermal"])
    bus = int(VENDORS[vendor][5].split(":")[1], 16)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(pci_domain_id=0, pci_bus_id=bus if i == 1 else 0x03, pci_device_id=0))
    monkeypatch.setattr(torch.version, "hip", "6.3.42131-fa1d09cbd" if vendor == "amdsmi" else None)
    samplers = {s.name: s for s in dohnuts_bench_register_telemetry()}
    other = "nvml" if vendor == "amdsmi" else "amdsmi"
    assert samplers[other].unavailable == ("no AMD GPU" if other == "amdsmi" else "no NVIDIA GPU")
    mine = samplers[vendor]
    assert mine.unavailable is None and mine.device_match == f"PCI {VENDORS[vendor][5]}"
    assert mine.sample()["throttling"]


@pytest.mark.parametrize("vendor", VENDORS)
def test_energy_per_call_and_per_decision_in_the_summary_and_the_report(tmp_path, monkeypatch, vendor):
    """The summary row of a group of calls carries the vendor counter's joules per call (their mean)
    and per decision (their sum over the decisions); the text report shows them. A CPU run's row
    has None for both, and the report says "no energy counter"."""
    from rich.console import Console

    from dohnuts.bench.analysis.summary import summarize
    from dohnuts.bench.report.text_report import summary_table

    records = _call_records(tmp_path, monkeypatch, vendor, ["power-capped", "clean", "idle"])
    recs = [rec for rec, _ in records.values()]
    joules = [replay.energy_j(1, 2) - replay.energy_j(1, 0) for _, replay in records.values()]
    [row] = summarize(recs)
    assert row["energy_j_per_call"] == pytest.approx(sum(joules) / 3, rel=1e-9)
    assert row["energy_j_per_decision"] == pytest.approx(sum(joules) / sum(r.decisions for r in recs), rel=1e-9)
    assert (row["energy_source"], row["energy_calls"]) == (vendor, 3)
    assert row["energy_j_per_call"] > 20  # two 100 ms intervals near the board power, and one idle

    telemetry = TelemetryThread([])
    cpu = [_measure(tmp_path, GpuStateTarget(telemetry, lambda state: None), telemetry, [0], iteration=i)
           for i in range(2)]
    [cpu_row] = summarize(cpu)
    assert cpu_row["energy_j_per_call"] is None and cpu_row["energy_j_per_decision"] is None
    assert (cpu_row["energy_source"], cpu_row["energy_calls"]) == (None, 0)

    console = Console(width=250, record=True, file=io.StringIO())
    console.print(summary_table([row]))
    text = console.export_text()
    assert f"{row['energy_j_per_call']:.3g} J" in text and f"{row['energy_j_per_decision']:.3g}" in text
    console = Console(width=250, record=True, file=io.StringIO())
    console.print(summary_table([cpu_row]))
    assert "no energy counter" in console.export_text()


# -- the recorded amdsmi responses against the real binding ------------------------------------------

def _amdsmi_source():
    """The installed amdsmi binding's amdsmi_interface.py, read without importing it (importing
    needs ROCm's libamd_smi.so), and its version; skipped where amdsmi is not installed (the
    `test` extra installs the version the fixture records)."""
    import ast
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("the amdsmi binding is not installed (pip install -e '.[test]')")
    path = Path(next(iter(spec.submodule_search_locations))) / "amdsmi_interface.py"
    return ast.parse(path.read_text(encoding="utf-8")), importlib.metadata.version("amdsmi")


def _returned_keys(fn) -> list[str] | None:
    """The keys of the dict literal a binding function returns (directly, or through a name)."""
    import ast

    named = {n.targets[0].id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
             and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Dict)}
    found = None
    for node in ast.walk(fn):
        if isinstance(node, ast.Return) and node.value is not None:
            value = named.get(node.value.id) if isinstance(node.value, ast.Name) else node.value
            if isinstance(value, ast.Dict):
                found = [k.value for k in value.keys]
    return found


def test_the_amdsmi_fixture_has_the_shapes_of_the_real_binding():
    """Every function the replay serves exists in the binding with the same parameters, each
    recorded response has exactly the keys that function returns, and the enum members the
    sampler names exist: the fixture is the real API's shapes, not a hand-made fake."""
    import ast
    import inspect

    tree, version = _amdsmi_source()
    data = AmdSmiReplay(["clean", "clean"]).data
    assert version == data["amdsmi"], f"the fixture records amdsmi {data['amdsmi']}, {version} is installed"
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    served = [name for name in vars(AmdSmiReplay) if name.startswith("amdsmi_")]
    assert len(served) >= 13
    for name in served:
        assert name in functions, f"{name} is not in the binding"
        real = [a.arg for a in functions[name].args.args]
        replay = list(inspect.signature(getattr(AmdSmiReplay, name)).parameters)[1:]  # without self
        if not functions[name].args.vararg:
            assert len(replay) == len(real), (name, replay, real)
    responses = {"amdsmi_get_lib_version": [data["amdsmi_get_lib_version"]]}
    for device in data["devices"]:
        for key, value in device.items():
            responses.setdefault(key.split()[0], []).append(value)
    for samples in data["scenarios"].values():
        for sample in samples:
            for key, value in sample.items():
                responses.setdefault(key.split()[0], []).append(value)
    checked = 0
    for name, values in responses.items():
        keys = _returned_keys(functions[name])
        for value in values:
            if isinstance(value, dict) and "raises" not in value:
                assert keys is not None and list(value) == keys, (name, sorted(set(value) ^ set(keys or ())))
                checked += 1
            elif not isinstance(value, dict):
                assert keys is None, (name, value)  # a scalar where the binding returns one (bdf, uuid, temperature)
    assert checked > 50
    enums = {n.name: {t.id for s in n.body if isinstance(s, ast.Assign) for t in s.targets if isinstance(t, ast.Name)}
             for n in tree.body if isinstance(n, ast.ClassDef)}
    for enum in ("AmdSmiClkType", "AmdSmiTemperatureType", "AmdSmiTemperatureMetric"):
        assert {m.name for m in getattr(AmdSmiReplay, enum)} <= enums[enum], enum


def test_amdsmi_temperature_limits_in_degrees_or_millidegrees():
    """The binding returns °C (the library divides by 1000); its header documents millidegrees:
    both read as °C."""
    from dohnuts_bench_plugins.telemetry.amd import _celsius

    assert _celsius(110) == 110 and _celsius(110000) == 110 and _celsius("N/A") is None and _celsius(0) is None
