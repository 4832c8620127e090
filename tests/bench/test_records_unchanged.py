"""The standard suite on the CPU gives the records it gave before the bench was reorganised
(issue 46: the floor plan and the run's lifecycle change no record).

tests/bench/fixtures/cpu-standard-suite-shapes.json is the suite's run made by the code before
that change (d37d1f2), kept by tests/bench/record_shapes.py: every field of every record, of
run.json and summary.json, with its value where the value does not depend on time or on the
host (that module's docstring lists what is set aside). A fresh run must give the same file,
field by field. It was regenerated once since, for the record's schema 2 (issue 46, the typed
record: dohnuts.bench.analysis.records), whose declared change was the only difference: `schema`
1 → 2, and the fields a call has no value for written as null (or their default) instead of left
out — a first call's and a stream request's `aa_half`, a stream request's `harness_overhead_ms`
and `harness_overhead`, `energy.window` where there is none, `validity.power_capped` (0); run.json
and summary.json unchanged. And once for the headline's host-bound peers (M37): summary.json's
`sections.headline.host_bound`, an empty list on the CPU; no record changed. And once for the cold
workload's new image every call (M45): its comment changed, so its `workload.file_hash`; nothing else.
And once for where the run's time went (M45): run.json's and summary.json's `timing.workloads.<name>`
gained `spent_s` and `targets_s` (dohnuts.bench.measure.run_clock.spent); no record changed. And
once for train-step's pipelined updates (M45): a new group, `train-step · dohnuts · stream`; no
other record changed.
And once for the host's CPU model (M46): run.json's `measured.machine.cpu_model` and summary.json's
`sections.machine.cpu_model`, set aside as the host's; no record changed. And once for the peers'
installed versions (session 51: peft 0.22.0's release failed a clean clone's run on `extra.peer.peft`):
`extra.peer.version` and `extra.peer.peft` set aside as the host's environment; no record changed.
Regenerate it only for a change that means to change the records:

    python -m dohnuts.bench.cli run --out /tmp/suite --quiet
    python tests/bench/record_shapes.py /tmp/suite/*/ > tests/bench/fixtures/cpu-standard-suite-shapes.json
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.record_shapes import dumps, run_shapes

GOLDEN = Path(__file__).parent / "fixtures" / "cpu-standard-suite-shapes.json"


def _differences(golden, now, path: str = "") -> list[str]:
    """Every field where `now` differs from `golden`, as `path: golden → now`."""
    if isinstance(golden, dict) and isinstance(now, dict):
        out = []
        for key in sorted(set(golden) | set(now)):
            here = f"{path}/{key}"
            if key not in now:
                out.append(f"{here}: missing now (was {json.dumps(golden[key])[:80]})")
            elif key not in golden:
                out.append(f"{here}: new ({json.dumps(now[key])[:80]})")
            else:
                out += _differences(golden[key], now[key], here)
        return out
    return [] if golden == now else [f"{path}: {json.dumps(golden)[:80]} → {json.dumps(now)[:80]}"]


def test_the_differences_name_each_field():
    assert _differences({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": 0}}) == ["/a/c: 2 → 3", "/a/d: new (0)"]
    assert _differences({"a": [1]}, {}) == ["/a: missing now (was [1])"]


def test_the_golden_file_is_what_the_script_writes():
    """The golden file is the script's output format, and small (kept in git)."""
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert dumps(golden) + "\n" == GOLDEN.read_text(encoding="utf-8")
    assert GOLDEN.stat().st_size < 120_000  # 102 KB since M45 (the run's phases, the training stream)
    groups = golden["records"]["groups"]  # every kind of record the CPU suite makes
    assert {g.rsplit(" · ", 1)[1] for g in groups} == {"first-call", "steady", "stream"}
    assert {g.split(" · ")[1] for g in groups} == {"dohnuts", "dohnuts-unshared", "transformers", "transformers+peft"}


@pytest.mark.slow(seconds=45)
def test_the_standard_suite_gives_the_records_it_gave(main_job_run):
    """The README's main job (`dohnuts-bench run`: the standard suite on the CPU, made once for the
    test command by tests/conftest.py's main_job_run) gives the golden file's records."""
    (run_dir,) = list((main_job_run / "runs" / "bench").iterdir())
    now = json.loads(dumps(run_shapes(run_dir)))
    golden = json.loads(GOLDEN.read_text(encoding="utf-8"))
    differences = _differences(golden, now)
    assert not differences, f"{len(differences)} fields differ:\n" + "\n".join(differences[:40])
