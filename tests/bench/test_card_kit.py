"""The run kit (benchmarks/card_kit.sh): calibrate, then the suite against the calibrated copy.

The dry run on the CPU is the same script a user with the card runs: it measures this machine
(the CPU's run-start microbenchmarks), writes them into the `measured:` section of a copy of the
RX 7900 XTX spec — every datasheet ceiling as it was — and runs a tiny suite against the copy.
The hwspec loader reads and checks that section (tests below: every bad entry is one error).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from dohnuts.bench.analysis.hwspec import find_hwspec, load_hwspec, parse_hwspec
from dohnuts.bench.cli import main
from dohnuts.bench.commands.calibrate import with_measured_section
from dohnuts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TINY = """kind: text
targets: [dohnuts]
model: tiny
warmup: 1
repeat: 3
shape: {requests: 1, questions: 2, seq_tokens: 64, candidates: 2, candidate_tokens: 2}
"""


def _section(**ceilings) -> dict:
    return {"date": "2026-12-02", "device": "AMD Radeon RX 7900 XTX", "method": "dohnuts-bench calibrate",
            "ceilings": {k: {"value": v, "kind": "bandwidth" if k in ("device_copy", "h2d_pinned", "d2h_pinned")
                             else "compute", "method": f"{k} timing", "date": "2026-12-02"}
                         for k, v in ceilings.items()}}


@pytest.mark.slow
def test_the_kit_dry_run_on_the_cpu(tmp_path):
    spec = tmp_path / "rx7900xtx.yaml"
    shutil.copy(ROOT / "hwspecs" / "rx7900xtx.yaml", spec)
    (tmp_path / "tiny.yaml").write_text(TINY)
    env = dict(os.environ, PYTHON=sys.executable, HWSPEC=str(spec), OUT=str(tmp_path / "runs"),
               WORKLOADS=str(tmp_path / "tiny.yaml"), QUIET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "card_kit.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "does not describe this device" in done.stdout  # the CPU is not the card: said, and measured

    copy = tmp_path / "runs" / "hwspecs" / "rx7900xtx.yaml"
    original, calibrated = load_hwspec(spec), load_hwspec(copy)
    # the datasheet numbers stay: every ceiling of the original, and the role tables, as they were
    for name, ceiling in original.ceilings.items():
        assert calibrated.ceilings[name] == ceiling
    assert calibrated.roles == original.roles
    assert copy.read_text().startswith(spec.read_text().rstrip("\n"))  # text and comments kept, section after
    # the section: this CPU's microbenchmarks, each a measured ceiling; the BF16 matmul and the copy
    # take the measured basis of the roles a run's own measurement would
    section = yaml.safe_load(copy.read_text())["measured"]
    assert set(section["ceilings"]) == {"fp32_matmul", "bf16_matmul", "fp32_vector", "device_copy", "host_copy"}
    assert section["provenance"]["device"]["type"] == "cpu"
    for key, entry in section["ceilings"].items():
        ceiling = calibrated.ceilings[f"{key}_calibrated"]
        assert ceiling.provenance == "measured" and ceiling.value == entry["value"] > 0
    assert calibrated.ceiling("matrix", "bf16", "measured").name == "bf16_matmul_calibrated"
    assert calibrated.ceiling("memory", "fp32", "measured").name == "device_copy_calibrated"
    assert calibrated.calibration["method"].startswith("dohnuts-bench calibrate")

    # the suite ran against the copy and wrote the report
    [run] = (tmp_path / "runs" / "bench").iterdir()
    assert run.name.endswith("rx7900xtx")
    meta = json.loads((run / "run.json").read_text())
    assert Path(meta["hwspec"]) == copy.resolve()
    report = (run / "report.txt").read_text()
    assert "AMD Radeon RX 7900 XTX: bounds and efficiency" in report and str(copy) in report
    assert (run / "summary.json").is_file() and (run / "report.html").is_file()


def test_calibrate_writes_the_section_into_a_copy(tmp_path, monkeypatch):
    """`dohnuts-bench calibrate` with the measurements stubbed (the dry run above times the real
    ones): a second calibration replaces the section, the rest of the text stays."""
    import dohnuts.bench.commands.calibrate as calibrate

    values = iter([1.0e14, 2.0e14])
    monkeypatch.setattr(calibrate, "measure", lambda device, console: {
        "bf16_matmul": {"value": next(values), "kind": "compute", "unit": "FLOP/s", "method": "stub", "date": "2026-12-02"},
        "device_copy": {"value": 8e11, "kind": "bandwidth", "unit": "B/s", "method": "stub", "date": "2026-12-02"}})
    out = tmp_path / "specs" / "card.yaml"
    assert main(["calibrate", "--hwspec", "rx7900xtx", "--write", str(out)]) == 0
    first = out.read_text()
    assert main(["calibrate", "--hwspec", str(out), "--write", str(out)]) == 0  # in place: the section replaced
    second = out.read_text()
    assert second.count("\nmeasured:") == 1 and second.count("# Measured on the device") == 1
    assert first.split("\nmeasured:")[0] == second.split("\nmeasured:")[0]
    spec = load_hwspec(out)
    assert spec.ceiling("matrix", "bf16", "measured").value == 2.0e14
    assert spec.ceiling("memory", "bf16", "measured").value == 8e11
    assert spec.ceiling("matrix", "bf16").value == 122.88e12  # the datasheet basis is untouched


def test_calibrate_refuses_a_bad_destination_or_spec(tmp_path, capsys):
    assert main(["calibrate", "--hwspec", "rx7900xtx", "--write", str(tmp_path)]) == 2
    assert "--write" in capsys.readouterr().err
    assert main(["calibrate", "--hwspec", "nonesuch", "--write", str(tmp_path / "x.yaml")]) == 2
    assert "nonesuch" in capsys.readouterr().err
    assert not (tmp_path / "x.yaml").exists()


def test_a_measured_section_takes_the_roles_a_run_measurement_would():
    base = yaml.safe_load((ROOT / "hwspecs" / "rx7900xtx.yaml").read_text())
    data = dict(base, measured=_section(bf16_matmul=95e12, bf16_matmul_sustained=80e12, device_copy=1.6e12,
                                        h2d_pinned=24e9, d2h_pinned=25e9, fp32_fma=40e12, fp32_matmul=30e12))
    spec = parse_hwspec(data, source="card.yaml")
    assert spec.bases("bf16") == ("datasheet", "measured", "sustained")
    assert spec.ceiling("matrix", "bf16", "measured").value == 95e12
    assert spec.ceiling("scan", "bf16", "sustained").value == 80e12
    assert spec.ceiling("memory", "fp32", "measured").value == 1.6e12
    assert spec.ceiling("host_link", "bf16", "measured").value == 25e9  # the faster pinned copy: bounds stay optimistic
    assert spec.ceiling("vector", "fp32", "measured").value == 40e12
    assert spec.ceiling("matrix", "fp32", "measured").name == "fp32_vector"  # fp32_matmul bounds no role: datasheet
    assert "fp32_matmul_calibrated" in spec.ceilings
    assert "dohnuts-bench calibrate on AMD Radeon RX 7900 XTX, 2026-12-02" in spec.ceilings["bf16_matmul_calibrated"].source
    # a run's own measurement replaces the calibrated one for that run
    from dohnuts.bench.analysis.hwspec import with_measured_ceilings

    run = with_measured_ceilings(spec, {"bf16_matmul": {"value": 90e12, "kind": "compute"}})
    assert run.ceiling("matrix", "bf16", "measured").name == "bf16_matmul_this_run"
    assert run.ceiling("memory", "bf16", "measured").name == "device_copy_calibrated"


@pytest.mark.parametrize("change, field", [
    (lambda m: m["ceilings"].update(warp_speed={"value": 1, "kind": "compute", "method": "x", "date": "d"}),
     "measured.ceilings.warp_speed"),
    (lambda m: m["ceilings"]["bf16_matmul"].update(kind="bandwidth"), "measured.ceilings.bf16_matmul.kind"),
    (lambda m: m["ceilings"]["bf16_matmul"].update(value=-3), "measured.ceilings.bf16_matmul.value"),
    (lambda m: m["ceilings"]["bf16_matmul"].update(value="fast"), "measured.ceilings.bf16_matmul.value"),
    (lambda m: m["ceilings"]["bf16_matmul"].pop("date"), "measured.ceilings.bf16_matmul.date"),
    (lambda m: m["ceilings"]["bf16_matmul"].update(unit="B/s"), "measured.ceilings.bf16_matmul.unit"),
    (lambda m: m["ceilings"].clear(), "measured.ceilings"),
    (lambda m: m.pop("device"), "measured.device"),
    (lambda m: m.update(date=""), "measured.date"),
    (lambda m: m.update(extra=1), "measured.extra"),
])
def test_a_bad_measured_section_is_one_error_naming_the_field(change, field):
    base = yaml.safe_load((ROOT / "hwspecs" / "rx7900xtx.yaml").read_text())
    section = _section(bf16_matmul=95e12)
    change(section)
    with pytest.raises(ConfigError) as err:
        parse_hwspec(dict(base, measured=section), source="card.yaml")
    assert "card.yaml" in str(err.value) and field in str(err.value) and "\n" not in str(err.value)


def test_with_measured_section_keeps_the_text():
    text = (ROOT / "hwspecs" / "h200.yaml").read_text()
    once = with_measured_section(text, _section(bf16_matmul=700e12))
    twice = with_measured_section(once, _section(bf16_matmul=650e12))
    assert once.startswith(text.rstrip("\n")) and twice.startswith(text.rstrip("\n"))
    assert yaml.safe_load(twice)["measured"]["ceilings"]["bf16_matmul"]["value"] == 650e12
    assert find_hwspec("h200").ceilings == {k: v for k, v in parse_hwspec(yaml.safe_load(twice), source="x")
                                            .ceilings.items() if not k.endswith("_calibrated")}
