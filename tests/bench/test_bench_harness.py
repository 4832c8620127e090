"""dohnuts-bench: every workload file validates, the CPU ones run, bad input fails clearly,
Ctrl-C keeps a valid JSONL, and an external plugin registered by entry point is picked up."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.measure.workload import load_workload, standard_files
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
ALL_WORKLOADS = sorted((ROOT / "workloads").rglob("*.yaml"))


def _registry():
    pm = plugin_manager()
    return collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")


@pytest.mark.parametrize("path", ALL_WORKLOADS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_workload_file_validates(path):
    kinds, targets = _registry()
    spec = load_workload(path, kinds, targets)
    assert spec.kind in kinds and spec.targets


def test_standard_suite_is_embedded_and_matches_the_repo_folder():
    embedded = {p.name for p in standard_files()}
    assert embedded == {p.name for p in (ROOT / "workloads").glob("*.yaml")}
    assert {"text.yaml", "shared-prefix.yaml", "image.yaml", "image-cache-cold.yaml", "image-cache-warm.yaml",
            "train-step.yaml"} <= embedded
    assert {"text.yaml", "shared-prefix.yaml", "image.yaml", "train-step.yaml"} <= embedded


@pytest.mark.slow
def test_quickstart_runs_on_cpu_and_records_every_call(main_job_run, tmp_path, capsys):
    """Every CPU workload file runs and records every call: the standard suite in the README's main
    job (made once for the test command: tests/conftest.py's main_job_run), the others here — but
    the served sets that tests/bench/test_serving_run.py runs whole."""
    served_elsewhere = {ROOT / "workloads" / "serving" / f"{n}.yaml" for n in ("text-tiny-server", "text-tiny-concurrency")}
    cpu = [p for p in ALL_WORKLOADS if not load_workload(p, *_registry()).requires_gpu and p not in served_elsewhere]
    assert all(p.is_file() for p in served_elsewhere)
    standard = {p.name for p in standard_files()}
    others = [p for p in cpu if not (p.parent == ROOT / "workloads" and p.name in standard)]
    assert len(others) < len(cpu) and others, "no CPU workload outside the standard suite to smoke-run"
    assert main(["run", *map(str, others), "--out", str(tmp_path), "--quiet"]) == 0
    (run_dir,) = list(tmp_path.iterdir())
    (main_job_dir,) = list((main_job_run / "runs" / "bench").iterdir())
    every = [json.loads(line) for d in (main_job_dir, run_dir) for line in (d / "results.jsonl").read_text().splitlines()]
    records = [r for r in every if r["phase"] == "steady"]
    first = [r for r in every if r["phase"] == "first-call"]
    stream = [r for r in every if r["phase"] == "stream"]
    kinds, targets = _registry()
    specs = [load_workload(p, kinds, targets) for p in cpu]
    for s in specs:  # at least `repeat` calls, more when the spread asks for them, never past the cap
        for t in s.targets:
            n = sum(1 for r in records if r["workload"]["name"] == s.name and r["target"] == t.label)
            assert s.repeat <= n <= (s.max_repeat or 4 * s.repeat), (s.name, t.label, n)
            halves = [r["aa_half"] for r in records if r["workload"]["name"] == s.name and r["target"] == t.label]
            assert halves == [i % 2 for i in range(len(halves))]  # interleaved A/A halves
    # a pipelined stream per dohnuts target — predictions through Predictor.run, updates through
    # Updater.run (not the peers'); the cold cache streams as a stream of new images does: every
    # streamed request encoded its image
    streamed = {(r["workload"]["name"], r["target"]) for r in stream}
    assert {("text", "dohnuts"), ("image-cache-warm", "dohnuts"), ("image-cache-cold", "dohnuts"),
            ("train-step", "dohnuts")} <= streamed
    assert not any(name == "train-step" and t != "dohnuts" for name, t in streamed)
    updates = [r for r in stream if r["workload"]["name"] == "train-step"]
    train_spec = next(s for s in specs if s.name == "train-step")
    assert len(updates) == train_spec.repeat and all(r["work"]["train"] and r["decisions"] > 0 for r in updates)
    cold = [r for r in stream if r["workload"]["name"] == "image-cache-cold"]
    assert cold and all(r["work"]["encoded_image_patches"] and not r["work"]["cached_images"] for r in cold)
    assert not any(t == "transformers" for _, t in streamed)
    for r in stream:
        assert r["extra"]["stream"]["latency_ms"] >= r["extra"]["stream"]["queue_ms"] >= 0 and r["wall_ms"] > 0
    # each target's first call is recorded apart (iteration −1), once, when it has warm-up calls
    assert len(first) == sum(len(s.targets) for s in specs if s.warmup) and all(r["iteration"] == -1 for r in first)
    for r in records:
        assert r["schema"] == 2 and r["wall_ms"] > 0 and r["decisions"] > 0
        assert sum(s["host_ms"] for s in r["stages"].values()) <= r["wall_ms"] * 1.05
        assert r["provenance"]["git"] and r["provenance"]["packages"]["torch"]
        rows = r["work"]["sequences"] + r["work"]["padded_rows"]
        assert rows * r["work"]["padded_len"] + r["work"]["prefix_len"] == r["tokens"]["computed"]
    kinds_seen = {r["workload"]["kind"] for r in records}
    assert {"text", "shared-prefix", "image", "image-cache", "train-step"} <= kinds_seen
    cold = [r for r in records if r["workload"]["name"] == "image-cache-cold"]
    warm = [r for r in records if r["workload"]["name"] == "image-cache-warm"]
    assert all(r["work"]["cached_images"] == 0 and "vision" in r["stages"] for r in cold)
    assert all(r["work"]["cached_images"] == 1 for r in warm)
    shared = [r for r in records if r["workload"]["kind"] == "shared-prefix" and r["target"] == "dohnuts"]
    # whether to share is measured on the first call (dohnuts.runtime.sharing); then it holds
    assert len({r["work"]["prefix_len"] for r in shared}) == 1
    # a shared call runs the prefix and its suffixes as one pass (`shared`, the merged default)
    assert all(("shared" in r["stages"]) == (r["work"]["prefix_len"] > 0) for r in shared)
    assert not any({"prefix", "suffix"} & set(r["stages"]) for r in shared)
    train = [r for r in records if r["workload"]["kind"] == "train-step"]
    assert all({"forward", "backward", "optimizer"} <= set(r["stages"]) for r in train)
    # an honest report: no efficiency above 100 % anywhere, the headline first (tests/bench/test_headline.py)
    from tests.bench.report_checks import html_cells, impossible_figures, text_tables

    for d in (main_job_dir, run_dir):
        assert (d / "report.txt").exists() and (d / "summary.json").exists()
        assert impossible_figures(d) == []
        assert text_tables((d / "report.txt").read_text())[0]["title"].startswith("Headline")
        assert html_cells((d / "report.html").read_text()).table_ids[0] == "headline"


BAD = {
    "malformed": ("kind: text\nshape: {questions: 4\n", "is not valid YAML at line"),
    "unknown_kind": ("kind: teleport\n", "field 'kind': unknown workload kind 'teleport'"),
    "missing_field": ("targets: [dohnuts]\n", "field 'kind': is missing"),
    "negative_size": ("kind: text\nshape: {questions: -3}\n", "field 'shape.questions': must be >= 1"),
    "unknown_preset": ("kind: text\nmodel: qwen9000\n", "field 'model': unknown preset 'qwen9000'"),
    "unknown_target": ("kind: text\ntargets: [vllm]\n", "field 'targets[0].name': unknown target 'vllm'"),
    "unknown_shape_field": ("kind: text\nshape: {qestions: 3}\n", "field 'shape.qestions': unknown field"),
    "target_cannot_run_kind": ("kind: train-step\ntargets: [transformers]\n", "cannot run 'train-step'"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_workload_is_one_line_exit_2(case, tmp_path, capsys):
    text, message = BAD[case]
    path = tmp_path / f"{case}.yaml"
    path.write_text(text)
    assert main(["run", str(path), "--out", str(tmp_path / "runs")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(path) in err[0] and message in err[0], err
    assert not (tmp_path / "runs").exists()  # nothing was measured


class _Interrupt:
    @hookimpl
    def dohnuts_bench_after_call(self, run, spec, target_name, record):
        if record.iteration == 2:
            raise KeyboardInterrupt


@pytest.mark.slow
def test_interrupt_leaves_valid_jsonl(tmp_path, monkeypatch):
    import dohnuts.bench.cli as cli
    import dohnuts.bench.plugins as plugins

    real = plugins.plugin_manager
    monkeypatch.setattr(cli, "plugin_manager", lambda: real(extra=(_Interrupt(),)), raising=False)
    monkeypatch.setattr(plugins, "plugin_manager", lambda extra=(): real(extra=(_Interrupt(), *extra)))
    code = main(["run", str(ROOT / "workloads/text.yaml"), "--out", str(tmp_path), "--quiet"])
    assert code == 130
    (run_dir,) = list(tmp_path.iterdir())
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert all(r["schema"] == 2 for r in records)  # the first call, then the measured calls 0 and 1
    assert [r["iteration"] for r in records] == [-1, 0, 1]


def test_external_plugin_registered_by_entry_point(tmp_path, monkeypatch):
    pkg = tmp_path / "site"
    (pkg / "acme_bench").mkdir(parents=True)
    (pkg / "acme_bench" / "__init__.py").write_text(textwrap.dedent("""
        from dohnuts.bench.hookspecs import hookimpl

        class Echo:
            name = "echo"
            def validate(self, shape, source):
                pass
            def calls(self, ctx):
                return []

        @hookimpl
        def dohnuts_bench_register_workload_kinds():
            return {"acme-echo": Echo()}
    """))
    dist = pkg / "acme_bench-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-bench\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[dohnuts_bench]\nacme = acme_bench\n")
    monkeypatch.syspath_prepend(str(pkg))
    kinds = collect(plugin_manager(), "dohnuts_bench_register_workload_kinds")
    assert "acme-echo" in kinds and "text" in kinds
    sys.modules.pop("acme_bench", None)


def test_reanalysis_of_committed_h200_run(tmp_path):
    """`dohnuts-bench analyze` works from a committed JSONL alone (the run's hwspec by name)."""
    src = ROOT / "tests/bench/fixtures/h200-text-shared/results.jsonl.gz"
    assert main(["analyze", str(src), "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    rows = {(r["workload"], r["target"]): r for r in summary["summary"]}
    assert rows[("text-2b", "dohnuts")]["decisions_per_s"] > rows[("text-2b", "transformers")]["decisions_per_s"]
    assert "efficiency" in summary["sections"] and (tmp_path / "roofline.png").exists()


def test_standard_suite_sizes_for_the_device():
    """One file, two sizes: tiny on a CPU, qwen3.5-2b on a GPU (both validated on any machine)."""
    kinds, targets = _registry()
    for path in standard_files():
        cpu = load_workload(path, kinds, targets, gpu=False)
        gpu = load_workload(path, kinds, targets, gpu=True)
        assert cpu.model == "tiny" and gpu.model == "qwen3.5-2b", path.name
        assert cpu.kind == gpu.kind and cpu.name == gpu.name
    text = load_workload(ROOT / "workloads" / "text.yaml", kinds, targets, gpu=True)
    assert (text.shape.questions, text.shape.seq_tokens) == (32, 512)
    assert text.shape.candidates == 4  # not overridden: the CPU value stays


def test_on_gpu_errors_name_the_field(tmp_path):
    kinds, targets = _registry()
    bad = tmp_path / "w.yaml"
    for text, field in (("on_gpu: {shape: {questions: -1}}", "on_gpu.shape.questions"),
                        ("on_gpu: {kind: image}", "on_gpu.kind"),
                        ("on_gpu: {model: no-such-preset}", "on_gpu.model"),
                        ("on_gpu: [1, 2]", "on_gpu")):
        bad.write_text("kind: text\nmodel: tiny\n" + text + "\n")
        with pytest.raises(ConfigError, match=rf"w.yaml: field '{field}'"):
            load_workload(bad, kinds, targets, gpu=False)  # the GPU variant is checked on a CPU too


@pytest.mark.slow
def test_a_target_that_cannot_run_here_is_skipped_with_its_reason(tmp_path, capsys, monkeypatch):
    from dohnuts_bench_plugins.targets.transformers_target import TransformersTarget

    monkeypatch.setattr(TransformersTarget, "unavailable", staticmethod(lambda: "transformers is not installed"))
    assert main(["run", str(ROOT / "workloads" / "text.yaml"), "--out", str(tmp_path), "--quiet"]) == 0
    assert "skipped target transformers" in capsys.readouterr().err  # a warning on stderr, even with --quiet
    (run_dir,) = list(tmp_path.iterdir())
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert records and {r["target"] for r in records} == {"dohnuts"}


@pytest.mark.slow
def test_a_run_against_itself_slowed_down_compares_as_slower_with_its_interval(tmp_path, capsys):
    """A real CPU run, compared with itself (no detectable change) and with a copy whose every time
    is multiplied by k (an injected slowdown of 2×, more where load spread the run's own calls
    wider: slower, the interval holding k); the quality table and the
    stream table are in its report; calls flagged invalid are left out of the analysis, counted."""
    from dohnuts.bench.analysis import analyze_records, read_records
    from dohnuts.bench.analysis.records import Validity
    from dohnuts.bench.analysis.hwspec import find_hwspec

    assert main(["run", str(ROOT / "workloads" / "text.yaml"), "--out", str(tmp_path / "a"), "--quiet"]) == 0
    (run_dir,) = list((tmp_path / "a").iterdir())
    report = (run_dir / "report.txt").read_text()
    assert "Measurement quality" in report and "Pipelined streams" in report and "A/A noise" in report
    assert "measured at run start, no datasheet spec" in report  # the CPU's bounds: measured ceilings
    assert (run_dir / "roofline.png").exists()
    slow = tmp_path / "slow" / "results.jsonl"
    slow.parent.mkdir()
    originals = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    # The slowdown: 2×, or more where this machine's load spread the run's own calls wider than 2×
    # (a 2× copy then overlaps the original, and no test of two samples may call it slower): every
    # slowed call then takes longer than every original one, whatever the load was.
    walls = [r["wall_ms"] for r in originals]
    k = max(2.0, 1.1 * max(walls) / min(walls))
    lines = []
    for r in originals:
        r["wall_ms"] *= k
        for st in r["stages"].values():
            st["host_ms"] *= k
            st["device_ms"] = None if st["device_ms"] is None else k * st["device_ms"]
        lines.append(json.dumps(r))
    slow.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(["compare", str(run_dir), str(run_dir)]) == 0
    same = capsys.readouterr().out
    assert "no detectable change" in same and "slower" not in same
    assert main(["compare", str(run_dir), str(slow), "--json", str(tmp_path / "cmp.json")]) == 1  # slower: exit 1
    rows = json.loads((tmp_path / "cmp.json").read_text())["rows"]
    wall = next(r for r in rows if r["target"] == "dohnuts" and r["stage"] == "wall")
    assert wall["verdict"] == "slower" and wall["ci_low"] <= k <= wall["ci_high"]
    records = read_records(run_dir / "results.jsonl")
    records[1].validity = Validity(valid=False, reasons=["sw_thermal_slowdown"])
    hw = find_hwspec("rx7900xtx")
    analysis = analyze_records(records, hw)
    assert any("1 call(s) left out" in w for w in analysis.warnings)


def test_list_shows_each_kinds_shape_fields(capsys, monkeypatch):
    """`dohnuts-bench list` shows every workload kind's shape fields (its `Shape` Struct): bounds,
    default (or required) and what the field is."""
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    assert "text shape: requests 1..1024 = 4: distinct requests, cycled; questions 1..4096 = 8" in out
    assert "image-cache shape:" in out and "cache cold|warm (required): cache state per call" in out
    assert "shared-prefix shape:" in out and "prefix_tokens 1.. (required)" in out
