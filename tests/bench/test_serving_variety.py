"""Served requests that vary (`serving.vary`): the set is seeded and spans its ranges, the order is
shuffled a round at a time, a bad `vary` is refused naming its field, and a CPU run's points state
the distinct shapes and graph captures a hand count predicts — with the graphs emulated on the CPU,
so the captures inside measured points are counted too. Nothing here asserts a time."""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from pathlib import Path

import pytest

from dohnuts.bench.cli import main
from dohnuts.bench.contracts import WorkloadContext
from dohnuts.bench.measure.serving.config import ImageVary, VaryFields
from dohnuts.bench.measure.serving.variety import RequestSize, ServedSet, draw_sizes, issue_order, spread
from dohnuts.bench.measure.workload import load_workload
from dohnuts.bench.plugins import collect, plugin_manager
from dohnuts.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_spread_covers_both_ends_evenly():
    assert spread(40, 100, 6).tolist() == [40, 52, 64, 76, 88, 100]
    assert spread(1, 3, 7).tolist() == [1, 1, 1, 2, 2, 3, 3]  # each count 2 or 3 times
    assert spread(5, 5, 4).tolist() == [5, 5, 5, 5]
    assert spread(16, 4096, 3).tolist() == [16, 2056, 4096]


def test_the_sizes_are_seeded_and_span_the_ranges():
    vary = VaryFields(distinct=40, seq_tokens=(48, 96), questions=(1, 3))
    a = draw_sizes(vary, seq_tokens=64, questions=2, resolutions=None, seed=7)
    assert a == draw_sizes(vary, seq_tokens=64, questions=2, resolutions=None, seed=7)
    assert a != draw_sizes(vary, seq_tokens=64, questions=2, resolutions=None, seed=8)
    seqs, qs = [s.seq_tokens for s in a], [s.questions for s in a]
    assert min(seqs) == 48 and max(seqs) == 96 and all(48 <= s <= 96 for s in seqs)
    assert sorted(Counter(qs).items()) == [(1, 14), (2, 13), (3, 13)]  # 40 draws over 3 counts
    assert all(s.resolution is None for s in a)
    assert seqs != sorted(seqs) and qs != sorted(qs)  # paired at random, not in order
    # a range left out keeps the shape's value
    fixed = draw_sizes(VaryFields(distinct=5, questions=(2, 4)), seq_tokens=64, questions=2, resolutions=None, seed=0)
    assert {s.seq_tokens for s in fixed} == {64} and sorted(s.questions for s in fixed) == [2, 2, 3, 3, 4]


def test_images_go_to_the_fraction_asked_at_the_resolutions_cycled():
    vary = VaryFields(distinct=10, images=ImageVary(fraction=0.5, resolutions=[(224, 224), (448, 320)]))
    sizes = draw_sizes(vary, seq_tokens=64, questions=2, resolutions=[(64, 64)], seed=3)
    with_image = [s.resolution for s in sizes if s.resolution is not None]
    assert with_image == [(224, 224), (448, 320)] * 2 + [(224, 224)]  # 5 of 10, cycled in request order
    # an image kind without `images`: every request has one, at the shape's resolutions
    every = draw_sizes(VaryFields(distinct=4), seq_tokens=64, questions=2, resolutions=[(64, 64), (32, 48)], seed=3)
    assert [s.resolution for s in every] == [(64, 64), (32, 48), (64, 64), (32, 48)]
    none = draw_sizes(VaryFields(distinct=4, images=ImageVary(fraction=0.0)), seq_tokens=64, questions=2,
                      resolutions=[(64, 64)], seed=3)
    assert all(s.resolution is None for s in none)


def test_the_order_is_a_seeded_permutation_a_round():
    order = issue_order(6, 20, seed=11)
    assert len(order) == 20
    for start in (0, 6, 12):
        assert sorted(order[start:start + 6]) == list(range(6))  # every request once a round
    assert sorted(order[18:]) != order[18:] or len(set(order[18:])) == 2  # the last, partial round
    assert order[:6] != list(range(6)) and order[:6] != order[6:12]  # shuffled, a fresh permutation each round
    assert order == issue_order(6, 20, seed=11) and order != issue_order(6, 20, seed=12)
    assert issue_order(6, 8, seed=11) == order[:8]  # a shorter point issues the same prefix
    # without vary: the workload's calls in order from the one after the warm-up
    assert ServedSet(list("abc"), varied=False, offset=2).issue(5) == [2, 0, 1, 2, 0]


def _ctx(spec, seed_text: str = "served"):
    from dohnuts.config import preset
    from dohnuts.runtime.tokenizer import tokenizer_for

    cfg = preset("tiny")
    return WorkloadContext(spec, tokenizer_for(cfg, None), cfg, Path("."), random.Random(seed_text))


def _registry():
    pm = plugin_manager()
    return collect(pm, "dohnuts_bench_register_workload_kinds"), collect(pm, "dohnuts_bench_register_targets")


def _spec(tmp_path: Path, body: str, name: str = "w.yaml"):
    path = tmp_path / name
    path.write_text(body)
    return load_workload(path, *_registry(), gpu=False)


TEXT = ("kind: text\ntargets: [dohnuts]\nmodel: tiny\n"
        "shape: {requests: 2, questions: 2, seq_tokens: 64, candidates: 2, candidate_tokens: 2}\n")


def test_the_text_kind_builds_the_drawn_requests(tmp_path):
    """Each request of the set has the drawn sizes (exact with the byte tokenizer), and the same
    seed builds the same requests."""
    from dohnuts.config import preset
    from dohnuts.runtime.plan import plan_request
    from dohnuts.runtime.tokenizer import tokenizer_for
    from dohnuts_bench_plugins.workloads import TextKind

    spec = _spec(tmp_path, TEXT + "serving: {vary: {distinct: 5, seq_tokens: [40, 100], questions: [1, 3]}}\n")
    calls = TextKind().varied_calls(_ctx(spec), spec.serving.vary)
    sizes = draw_sizes(spec.serving.vary, seq_tokens=64, questions=2, resolutions=None, seed=spec.seed)
    tok = tokenizer_for(preset("tiny"), None)
    for call, size in zip(calls, sizes, strict=True):
        plan = plan_request(call.request, tok, max_len=8192)
        assert len(call.request.questions) == size.questions
        assert list(plan.lengths) == [size.seq_tokens] * size.questions
    again = TextKind().varied_calls(_ctx(spec), spec.serving.vary)
    assert [c.request for c in again] == [c.request for c in calls]
    other = dataclasses.replace(spec, seed=1)
    assert [c.request for c in TextKind().varied_calls(_ctx(other), spec.serving.vary)] != [c.request for c in calls]


def test_the_image_kind_gives_each_image_request_its_own_image(tmp_path):
    from PIL import Image

    from dohnuts_bench_plugins.workloads import ImageKind

    body = ("kind: image\ntargets: [dohnuts]\nmodel: tiny\n"
            "shape: {requests: 2, questions: 1, seq_tokens: 64, candidates: 2, candidate_tokens: 2, "
            "resolution: [64, 64]}\n"
            "serving: {vary: {distinct: 6, images: {fraction: 0.5, resolutions: [[64, 32], [32, 96]]}}}\n")
    spec = _spec(tmp_path, body)
    ctx = WorkloadContext(spec, _ctx(spec).tokenizer, _ctx(spec).model_cfg, tmp_path, random.Random(0))
    calls = ImageKind().varied_calls(ctx, spec.serving.vary)
    images = [c.request.image for c in calls if c.request.image is not None]
    assert len(images) == 3 and len(set(images)) == 3
    assert [Image.open(p).size for p in images] == [(64, 32), (32, 96), (64, 32)]


@pytest.mark.parametrize("vary, field", [
    ("{seq_tokens: [20, 64]}", "serving.vary.seq_tokens"),  # 20 tokens cannot hold 2 candidates
    ("{seq_tokens: [64, 9000]}", "serving.vary.seq_tokens"),  # past the tiny preset's context
    ("{seq_tokens: [96, 48]}", "serving.vary.seq_tokens"),
    ("{questions: [1, 5000]}", "serving.vary.questions"),
    ("{images: {fraction: 0.5}}", "serving.vary.images"),  # text requests carry no image
    ("{distinct: 0}", "serving.vary.distinct"),
    ("{distinct: 1024, seq_tokens: [64, 65536], questions: [1, 4096]}", "serving.vary"),
])
def test_a_bad_vary_is_refused_naming_its_field(tmp_path, vary, field):
    with pytest.raises(ConfigError) as err:
        _spec(tmp_path, TEXT + f"serving: {{vary: {vary}}}\n")
    assert err.value.field is not None and err.value.field.startswith(field), str(err.value)
    assert "w.yaml" in str(err.value)


def test_a_kind_without_varied_sets_refuses_vary(tmp_path):
    body = ("kind: requests\ntargets: [dohnuts]\nmodel: tiny\nshape: {set: digits, limit: 4}\n"
            "serving: {vary: {distinct: 4}}\n")
    with pytest.raises(ConfigError) as err:
        _spec(tmp_path, body)
    assert err.value.field == "serving.vary" and "cannot vary" in err.value.message


def test_the_standard_serving_workloads_vary_their_requests():
    for name in ("text-tiny-server", "text-2b-server", "shared-prefix-2b-server"):
        for gpu in (False, True):
            spec = load_workload(ROOT / "workloads" / "serving" / f"{name}.yaml", *_registry(), gpu=gpu)
            assert spec.serving.vary is not None and spec.serving.vary.distinct >= 12, name


# -- a CPU run -----------------------------------------------------------------------------------

RUN = ("kind: text\ntargets: [dohnuts]\nmodel: tiny\nwarmup: 1\nrepeat: 3\nhalfwidth: 0\n"
       "shape: {requests: 2, questions: 2, seq_tokens: 64, candidates: 2, candidate_tokens: 2}\n"
       "agreement: {sample: 0}\n")
VARY = "vary: {distinct: 6, seq_tokens: [40, 100], questions: [1, 3]}"


def _bucket(rows: int, length: int) -> tuple[int, int]:
    """The graphs' bucket by hand (dohnuts.runtime.graphs.ShapeBuckets, lengths ≤ 256): rows up the
    ladder 1, 2, 4, 8, ...; lengths up to a multiple of 16."""
    return next(r for r in (1, 2, 4, 8) if r >= rows), -(-length // 16) * 16


def _run(tmp_path: Path, body: str, monkeypatch=None) -> tuple[list[dict], Path]:
    (tmp_path / "v.yaml").write_text(body)
    assert main(["run", str(tmp_path / "v.yaml"), "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()], run_dir


def _points(records: list[dict]) -> dict[int, list[dict]]:
    points: dict[int, list[dict]] = {}
    for r in records:
        if r["phase"] == "server":
            points.setdefault(r["extra"]["serving"]["point"]["point"], []).append(r)
    return points


@pytest.mark.slow
def test_a_cpu_run_states_the_shapes_it_served(tmp_path):
    """Each point's distinct shapes equal a hand count over the drawn sizes of the requests it
    served; each record ran its drawn sizes; no graphs on the CPU: captures not counted (None)."""
    records, run_dir = _run(tmp_path, RUN + "scenario: server\nserving: {rates: [20, 40], min_requests: 18, "
                                             f"min_duration_s: 0, {VARY}}}\n")
    sizes = draw_sizes(VaryFields(distinct=6, seq_tokens=(40, 100), questions=(1, 3)), seq_tokens=64, questions=2,
                       resolutions=None, seed=0)
    points = _points(records)
    assert len(points) == 2
    for recs in points.values():
        facts = recs[0]["extra"]["serving"]["point"]["served_set"]
        drawn = [sizes[r["extra"]["serving"]["set_index"]] for r in recs]
        for r, size in zip(recs, drawn):
            assert r["work"]["sequences"] == size.questions and r["work"]["padded_len"] == size.seq_tokens
        assert facts["varied"] and facts["set_size"] == 6
        assert facts["shapes"] == len({(s.questions, s.seq_tokens) for s in drawn}) == 6
        assert facts["requests"] == len({r["extra"]["serving"]["set_index"] for r in recs}) == 6
        assert facts["graph_captures"] is None
        order = [r["extra"]["serving"]["set_index"] for r in sorted(recs, key=lambda r: r["iteration"])]
        assert order == issue_order(6, len(order), seed=0)
    summary = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]
    (curve,) = summary["curves"]
    assert curve["served_set"] == {"varied": True, "set_size": 6, "shapes": 6, "graph_captures": None,
                                   "graph_eager": None}
    assert all(p["extra"]["served_set"]["shapes"] == 6 for p in curve["points"])
    text = (run_dir / "report.txt").read_text()
    assert "a varied set of 6 requests" in text and "6 distinct pass shapes" in text
    assert "graph captures not counted" in text
    assert "data-key='shapes'" in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_graph_captures_inside_measured_points_are_counted(tmp_path, monkeypatch):
    """With the dohnuts target's graphs emulated on the CPU (the GPU's buffer discipline and
    counts, dohnuts.runtime.graphs), the first point captures every bucket of the set that the
    warm-up's single calls (2 questions × 64 tokens) did not, the second none; a stream of the
    same set after them none either."""
    from dohnuts.runtime.graphs import PassGraphs
    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget

    built = DohnutsTarget.__init__

    def with_graphs(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.model.graphs = PassGraphs(self.model.model, emulate=True)

    monkeypatch.setattr(DohnutsTarget, "__init__", with_graphs)
    # an SLO no point meets: the lowest failing point, the first, is the search's bracket
    records, run_dir = _run(tmp_path, RUN + "scenario: server\nserving: {rates: [20, 40], slo_ms: 0.001, "
                                             "search: {low_rps: 30, points: 1}, min_requests: 18, "
                                             f"min_duration_s: 0, {VARY}}}\n")
    sizes = draw_sizes(VaryFields(distinct=6, seq_tokens=(40, 100), questions=(1, 3)), seq_tokens=64, questions=2,
                       resolutions=None, seed=0)
    warm = {_bucket(2, 64)}
    points = _points(records)
    first, *later = (points[k] for k in sorted(points))  # the fixed rates, then the search's probe
    assert len(later) == 2
    served = {_bucket(sizes[r["extra"]["serving"]["set_index"]].questions,
                      sizes[r["extra"]["serving"]["set_index"]].seq_tokens) for r in first}
    f1 = first[0]["extra"]["serving"]["point"]["served_set"]
    assert f1["shapes"] == len(served) and f1["graph_captures"] == len(served - warm) > 0
    for recs in later:
        facts = recs[0]["extra"]["serving"]["point"]["served_set"]
        assert facts["shapes"] == len(served) and facts["graph_captures"] == 0
    assert f1["graph_eager"] == 0 and f1["graph_capture_ms"] > 0
    for r in first:  # the bucketed pass each request ran
        size = sizes[r["extra"]["serving"]["set_index"]]
        rows, length = _bucket(size.questions, size.seq_tokens)
        assert (r["work"]["sequences"] + r["work"]["padded_rows"], r["work"]["padded_len"]) == (rows, length)
    (curve,) = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]["curves"]
    assert curve["served_set"]["graph_captures"] == len(served - warm)
    text = (run_dir / "report.txt").read_text()
    assert f"{len(served - warm)} graph captures while measuring" in text
    assert f"the failing point captured {len(served - warm)} graph" in text
    assert f"the failing point captured {len(served - warm)} graph(s)" in (run_dir / "report.html").read_text()


@pytest.mark.slow
def test_passes_run_eagerly_inside_measured_points_are_counted_and_said(tmp_path, monkeypatch):
    """With the dohnuts target's graphs emulated on the CPU and a budget of one graph, the warm-up
    captures its bucket (2 questions × 64 tokens) and every served request of another bucket runs
    eagerly: each point counts those passes, and the text report and the page say them beside the
    captures (a target whose captures failed shows the same)."""
    from dohnuts.runtime.graphs import PassGraphs
    from dohnuts_bench_plugins.targets.dohnuts_target import DohnutsTarget

    built = DohnutsTarget.__init__

    def with_one_graph(self, *args, **kwargs):
        built(self, *args, **kwargs)
        self.model.graphs = PassGraphs(self.model.model, emulate=True, max_graphs=1)

    monkeypatch.setattr(DohnutsTarget, "__init__", with_one_graph)
    records, run_dir = _run(tmp_path, RUN + "scenario: server\nserving: {rates: [20], min_requests: 12, "
                                             f"min_duration_s: 0, {VARY}}}\n")
    sizes = draw_sizes(VaryFields(distinct=6, seq_tokens=(40, 100), questions=(1, 3)), seq_tokens=64, questions=2,
                       resolutions=None, seed=0)
    (recs,) = _points(records).values()
    outside = sum(_bucket(sizes[r["extra"]["serving"]["set_index"]].questions,
                          sizes[r["extra"]["serving"]["set_index"]].seq_tokens) != _bucket(2, 64) for r in recs)
    facts = recs[0]["extra"]["serving"]["point"]["served_set"]
    assert facts["graph_captures"] == 0 and facts["graph_eager"] == outside > 0
    (curve,) = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]["curves"]
    assert curve["served_set"]["graph_eager"] == outside
    text = (run_dir / "report.txt").read_text()
    assert f"0 ({outside} eager)" in text
    assert f"{outside} passes run eagerly (outside every graph bucket, past the graph budget or a failed capture)" in text
    assert f"{outside} passes run eagerly" in (run_dir / "report.html").read_text()

@pytest.mark.slow
def test_the_streams_serve_the_varied_set(tmp_path):
    """The stream scenario and the stream beside single calls issue the set in its seeded order
    (beside single calls: the set once) and state its shapes; the stream beside single calls is not
    set against the single calls (other requests)."""
    (tmp_path / "stream.yaml").write_text(RUN + f"scenario: stream\nserving: {{min_requests: 14, min_duration_s: 0, "
                                                f"{VARY}}}\n")
    (tmp_path / "single.yaml").write_text(RUN + f"serving: {{{VARY}}}\n")
    files = [str(tmp_path / f) for f in ("stream.yaml", "single.yaml")]
    assert main(["run", *files, "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    sizes = draw_sizes(VaryFields(distinct=6, seq_tokens=(40, 100), questions=(1, 3)), seq_tokens=64, questions=2,
                       resolutions=None, seed=0)
    for name, n in (("stream", 14), ("single", 6)):
        stream = sorted((r for r in records if r["workload"]["name"] == name and r["phase"] == "stream"),
                        key=lambda r: r["iteration"])
        assert [r["extra"]["stream"]["set_index"] for r in stream] == issue_order(6, n, seed=0)
        for r in stream:
            size = sizes[r["extra"]["stream"]["set_index"]]
            assert (r["work"]["sequences"], r["work"]["padded_len"]) == (size.questions, size.seq_tokens)
        facts = stream[0]["extra"]["stream"]["served_set"]
        assert facts == {"varied": True, "set_size": 6, "requests": 6, "shapes": 6, "graph_captures": None,
                         "graph_capture_ms": None, "graph_eager": None}
    summary = json.loads((run_dir / "summary.json").read_text())
    (scenario,) = summary["sections"]["serving"]["streams"]
    assert scenario["served_set"]["shapes"] == 6
    beside = next(r for r in summary["summary"] if r["workload"] == "single" and "stream" in r)
    assert beside["stream"]["served_set"]["varied"] and "overlap" not in beside["stream"]
    assert "varied set" in (run_dir / "report.txt").read_text()
