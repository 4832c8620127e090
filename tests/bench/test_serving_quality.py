"""Quality in the same run as speed, on the CPU: the accuracy mode on the digits task (the harness's
count equals scoring the same requests through the API), a trained adapter's accuracy beside its
speed, and the reference check — every dohnuts variant agrees with its FP32 reference path on the
CPU, and a target whose fast path is wrong (an external plugin) is flagged on every performance
record and wherever its speed is reported."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

import dohnuts.api as api
from dohnuts.bench.cli import main
from dohnuts.bench.measure.quality import agreement, best_answer
from dohnuts.model.lora import LoRAConfig
from dohnuts.runtime.predict import QuestionResult, RequestResult
from dohnuts.runtime.requests import read_requests

FAULTY = textwrap.dedent('''
    """A dohnuts target whose fast path is wrong: it reverses each question's probabilities (and so
    its choice). Its reference options turn the fault off, as a plain reference path would."""
    import dataclasses

    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget
    from dohnuts.bench.hookspecs import hookimpl
    from dohnuts.runtime.predict import QuestionResult, RequestResult


    class FaultyDohnuts(DohnutsTarget):
        @dataclasses.dataclass(frozen=True)
        class Options(DohnutsTarget.Options):
            faulty: bool = True

        @staticmethod
        def reference_options(options):
            return dataclasses.replace(DohnutsTarget.reference_options(options), faulty=False)

        def __init__(self, spec, device, dtype, options):
            super().__init__(spec, device, dtype, options)
            self.faulty = options.faulty

        def run_call(self, call, timer):
            res = super().run_call(call, timer)
            if not self.faulty or res.output is None:
                return res
            qs = [QuestionResult(q.id, q.scores, q.probabilities[::-1], len(q.probabilities) - 1 - q.choice)
                  for q in res.output.questions]
            return dataclasses.replace(res, output=RequestResult(res.output.id, qs))


    @hookimpl
    def dohnuts_bench_register_targets():
        return {"faulty-dohnuts": FaultyDohnuts}
''')


@pytest.fixture(scope="module")
def digits_run(made_once):
    """One run of the digits requests: dohnuts, dohnuts with an adapter, and the faulty plugin
    (made once for every test process: tests/conftest.py's made_once). The digits come from
    scikit-learn, imported here rather than at collection, where every test process would."""
    pytest.importorskip("sklearn")
    tmp = made_once("digits-run", _make_digits_run)
    (run_dir,) = list((tmp / "runs").iterdir())
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    return tmp, run_dir, records


def _make_digits_run(tmp):
    adapted = api.load("tiny", device="cpu", lora=LoRAConfig(rank=4))
    with torch.no_grad():  # a head unlike the base's: another model with its own answers
        adapted.model.head.weight.copy_(torch.randn(adapted.model.head.weight.shape,
                                                    generator=torch.Generator().manual_seed(5)))
    from dohnuts.adapters import save_adapter

    save_adapter(adapted, tmp / "adapter.safetensors")
    site = tmp / "site"
    (site / "acme_faulty").mkdir(parents=True)
    (site / "acme_faulty" / "__init__.py").write_text(FAULTY)
    dist = site / "acme_faulty-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-faulty\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[dohnuts_bench]\nacme_faulty = acme_faulty\n")
    workload = tmp / "digits.yaml"
    workload.write_text(textwrap.dedent(f"""
        kind: requests
        targets:
          - dohnuts
          - {{name: dohnuts, label: dohnuts-adapter, options: {{adapter: {tmp / 'adapter.safetensors'}}}}}
          - faulty-dohnuts
        model: tiny
        warmup: 1
        repeat: 3
        halfwidth: 0
        shape: {{set: digits, split: test, limit: 4}}
        accuracy: {{set: digits, split: test, limit: 40}}
        agreement: {{sample: 2}}
    """))
    sys.path.insert(0, str(site))
    try:
        assert main(["run", str(workload), "--out", str(tmp / "runs"), "--quiet"]) == 0
    finally:
        sys.path.remove(str(site))
        sys.modules.pop("acme_faulty", None)


def _accuracy_records(records, target):
    return [r for r in records if r["phase"] == "accuracy" and r["target"] == target]


def _choices(session, requests) -> list[int]:
    return [q.choice for res in session.predict(requests) for q in res.questions]


@pytest.mark.slow
def test_accuracy_mode_on_digits_counts_what_the_api_answers(digits_run):
    tmp, run_dir, records = digits_run
    (test_file,) = list((run_dir / "inputs").rglob("digits/test.jsonl"))
    requests = [r for _, r in read_requests(test_file)][:40]
    acc = _accuracy_records(records, "dohnuts")
    assert [r["extra"]["accuracy"]["request"] for r in acc] == [r.id for r in requests]  # the set, in order, once
    answers = [best_answer(q) for r in requests for q in r.questions]
    assert [a for r in acc for a in r["extra"]["accuracy"]["answers"]] == answers
    expected = _choices(api.load("tiny", device="cpu"), requests)
    assert [c for r in acc for c in r["extra"]["accuracy"]["choices"]] == expected
    correct = sum(int(c == a) for c, a in zip(expected, answers))
    assert sum(r["extra"]["accuracy"]["correct"] for r in acc) == correct
    assert all(r["extra"]["accuracy"]["set"] == "digits:test" and r["wall_ms"] > 0 for r in acc)
    summary = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]
    rows = {q["target"]: q for q in summary["quality"]}
    assert rows["dohnuts"]["accuracy"]["questions"] == 40
    assert rows["dohnuts"]["accuracy"]["value"] == pytest.approx(correct / 40)
    low, high = rows["dohnuts"]["accuracy"]["low"], rows["dohnuts"]["accuracy"]["high"]
    assert low <= correct / 40 <= high


@pytest.mark.slow
def test_a_trained_adapter_reports_its_accuracy_beside_its_speed(digits_run):
    tmp, run_dir, records = digits_run
    (test_file,) = list((run_dir / "inputs").rglob("digits/test.jsonl"))
    requests = [r for _, r in read_requests(test_file)][:40]
    served = api.load("tiny", device="cpu", adapter=tmp / "adapter.safetensors", merge=True)
    expected = _choices(served, requests)
    acc = _accuracy_records(records, "dohnuts-adapter")
    assert [c for r in acc for c in r["extra"]["accuracy"]["choices"]] == expected
    base = [c for r in _accuracy_records(records, "dohnuts") for c in r["extra"]["accuracy"]["choices"]]
    assert expected != base  # the adapter's answers, not the base's
    serving = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]
    rows = {q["target"]: q for q in serving["quality"]}
    row = rows["dohnuts-adapter"]
    assert row["adapter"] == str(tmp / "adapter.safetensors")
    assert row["single_call_ms"] > 0 and row["decisions_per_s"] > 0  # speed beside accuracy
    assert row["agreement"]["within"]  # its reference path carries the same adapter
    text = (run_dir / "report.txt").read_text()
    assert "adapter.safetensors" in text and "Quality beside speed" in text


@pytest.mark.slow
def test_every_variant_is_checked_and_a_wrong_one_is_flagged_where_its_speed_is_reported(digits_run):
    _, run_dir, records = digits_run
    for target in ("dohnuts", "dohnuts-adapter"):
        steady = [r for r in records if r["target"] == target and r["phase"] == "steady"]
        assert steady and all(r["agreement"]["within"] and r["agreement"]["requests"] == 2 for r in steady)
        assert all(r["agreement"]["max_abs_gap"] <= 1e-4 for r in steady)
    wrong = [r for r in records if r["target"] == "faulty-dohnuts" and r["phase"] != "first-call"]
    assert wrong and all(r["agreement"]["within"] is False for r in wrong)  # every performance record flagged
    g = wrong[0]["agreement"]
    assert g["max_abs_gap"] > g["tolerance"] == 1e-4 and g["choice_agreement"] < 1.0
    summary = json.loads((run_dir / "summary.json").read_text())
    rows = {r["target"]: r for r in summary["summary"]}
    assert rows["faulty-dohnuts"]["agreement"]["within"] is False and rows["dohnuts"]["agreement"]["within"]
    text = (run_dir / "report.txt").read_text()
    assert "DISAGREES with the FP32 reference" in text  # in the summary table, beside its speed
    page = (run_dir / "report.html").read_text()
    assert "data-key='disagrees' data-group='digits|faulty-dohnuts'" in page
    assert "data-group='digits|dohnuts'>DISAGREES" not in page


def test_agreement_arithmetic():
    def result(*probs):
        return RequestResult("r", [QuestionResult(f"q{i}", [0.0] * len(p), list(p), max(range(len(p)),
                                                                                        key=p.__getitem__))
                                   for i, p in enumerate(probs)])

    ref = [result((0.7, 0.3), (0.2, 0.8))]
    same = agreement([result((0.7, 0.3), (0.2, 0.8))], ref, 1e-4)
    assert same["max_abs_gap"] == 0.0 and same["choice_agreement"] == 1.0 and same["within"]
    off = agreement([result((0.69, 0.31), (0.6, 0.4))], ref, 0.05)
    assert off["max_abs_gap"] == pytest.approx(0.4) and off["choice_agreement"] == 0.5 and not off["within"]
    assert off["questions"] == 2 and off["agreeing_choices"] == 1
    # with a yardstick (the reference path at the target's precision): 1.5 × its own gap, or the
    # stated tolerance where that is larger
    yard = [result((0.62, 0.38), (0.2, 0.8))]  # 0.08 from the reference
    near = agreement([result((0.6, 0.4), (0.2, 0.8))], ref, 0.05, yard)  # 0.10 ≤ 1.5 × 0.08
    assert near["yardstick_gap"] == pytest.approx(0.08) and near["tolerance"] == pytest.approx(0.12)
    assert near["stated_tolerance"] == 0.05 and near["within"]
    assert not agreement([result((0.55, 0.45), (0.2, 0.8))], ref, 0.05, yard)["within"]  # 0.15 > 0.12
    tight = agreement([result((0.66, 0.34), (0.2, 0.8))], ref, 0.05, [result((0.69, 0.31), (0.2, 0.8))])
    assert tight["tolerance"] == 0.05 and tight["within"]  # 1.5 × 0.01 < the stated 0.05
