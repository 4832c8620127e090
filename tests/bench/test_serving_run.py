"""Serving scenarios end to end on the CPU (tiny preset): the pipelined predictor as a server
(order, times, the same scores as single calls, the bounded queue), the server scenario of
workloads/serving/text-tiny-server.yaml through `dohnuts-bench run` (records, the report's curve
and search, the HTML panel, the store's columns), the stream and offline scenarios, and a point
short of its minimums marked invalid. Nothing here asserts a latency: the machine may be busy."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

import dohnuts.api as api
from dohnuts.bench.cli import main
from dohnuts.bench.measure.serving.pipelined import serve_pipelined
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Question, Request

ROOT = Path(__file__).resolve().parents[2]


def _requests(n: int) -> list[Request]:
    return [Request(id=f"r{i}", prefix="shared words " * 3,
                    questions=(Question("q0", f"which one {i}?", ("red", "green", "blue")),
                               Question("q1", f"and now {i}?", ("yes", "no")))) for i in range(n)]


@pytest.fixture(scope="module")
def predictor():
    p = Predictor(api.load("tiny", device="cpu"))
    yield p
    p.close()


def test_the_pipelined_server_serves_in_order_with_the_scores_of_single_calls(predictor):
    reqs = _requests(3)
    arrivals = [0.0, 0.0, 0.001, 0.002, 0.05, 0.05, 0.2]
    served = serve_pipelined(predictor, reqs, arrivals, capacity=None, timer_for=lambda i: _NoTimer())
    assert [r.outcome for r in served] == ["served"] * len(arrivals)
    starts = [r.start for r in served]
    assert starts == sorted(starts)  # first in, first out
    assert [r.completion for r in served] == sorted(r.completion for r in served)
    for r in served:
        assert r.arrival <= r.start <= r.first_byte <= r.completion
        alone, _ = predictor.call(reqs[r.index % 3])
        got = r.result["output"]
        assert got.id == alone.id and [q.probabilities for q in got.questions] == [q.probabilities
                                                                                   for q in alone.questions]
        assert r.result["decisions"] == 2 and r.result["work"].sequences == 2


def test_the_pipelined_server_refuses_what_the_queue_cannot_hold(predictor):
    # ten arrivals at once into a queue of one: the first is admitted, nine find it full
    served = serve_pipelined(predictor, _requests(2), [0.0] * 10, capacity=1, timer_for=lambda i: _NoTimer())
    assert [r.outcome for r in served] == ["served"] + ["dropped"] * 9


class _NoTimer:
    def stage(self, name):
        import contextlib

        return contextlib.nullcontext()


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def server_run(made_once):
    def make(out):
        assert main(["run", str(ROOT / "workloads" / "serving" / "text-tiny-server.yaml"), "--out",
                     str(out / "runs"), "--quiet"]) == 0

    (run_dir,) = list((made_once("server-run", make) / "runs").iterdir())
    return run_dir


@pytest.mark.slow
def test_the_server_scenario_records_every_served_request(server_run):
    records = _records(server_run)
    served = [r for r in records if r["phase"] == "server"]
    targets = {r["target"] for r in served}
    assert targets == {"dohnuts", "transformers"}
    assert all(r["scenario"] == "server" for r in records)
    points: dict = {}
    for r in served:
        s = r["extra"]["serving"]
        points.setdefault((r["target"], s["point"]["point"]), []).append(r)
        assert s["arrival_ms"] <= s["start_ms"] <= s["first_byte_ms"] <= s["completion_ms"]
        assert s["latency_ms"] == pytest.approx(s["completion_ms"] - s["arrival_ms"])
        assert s["queue_ms"] == pytest.approx(s["start_ms"] - s["arrival_ms"])
        assert r["wall_ms"] == pytest.approx(s["service_ms"])
        assert 1 <= r["work"]["sequences"] <= 3 and 48 <= r["work"]["padded_len"] <= 96  # serving.vary's ranges
    for (target, _), recs in points.items():
        facts = recs[0]["extra"]["serving"]["point"]
        assert facts["served"] == len(recs) and facts["offered"] == facts["served"] + facts["dropped"] + \
            facts["abandoned"]
        assert facts["rules"] == {"min_requests": 40, "min_duration_s": 0.5}
        assert facts["server"] == ("pipelined" if target == "dohnuts" else "serial")
        served_set = facts["served_set"]  # the varied set; no CUDA graphs on the CPU
        assert served_set["varied"] and served_set["set_size"] == 12 and served_set["graph_captures"] is None
        assert 1 <= served_set["shapes"] <= served_set["requests"] <= 12
        assert sorted(r["extra"]["serving"]["request"] for r in recs) == [r["iteration"] for r in recs]
    roles = {(t, recs[0]["extra"]["serving"]["point"]["role"]) for (t, _), recs in points.items()}
    assert ("dohnuts", "fixed") in roles and ("transformers", "fixed") in roles  # the fixed rate, then the search
    steady = [r for r in records if r["phase"] == "steady" and r["target"] == "dohnuts"]
    assert steady and all(r["agreement"]["within"] and r["agreement"]["tolerance"] == 1e-4 for r in steady)


@pytest.mark.slow
def test_the_report_shows_the_curve_the_search_and_the_bound(server_run):
    summary = json.loads((server_run / "summary.json").read_text())
    curves = {c["target"]: c for c in summary["sections"]["serving"]["curves"]}
    assert set(curves) == {"dohnuts", "transformers"}
    for c in curves.values():
        assert c["scenario"] == "server" and c["slo_ms"] == 400 and c["percentile"] == 0.9
        assert c["bound"]["latency_floor_ms"] > 0 and c["bound"]["throughput_ceiling_rps"] > 0
        assert c["search"] is not None and c["search"]["words"]
        fixed = [p for p in c["points"] if p["role"] == "fixed"]
        assert [p["rate_rps"] for p in fixed] == [4.0]
        for p in c["points"]:
            assert p["offered"] >= 1 and 0 <= p["goodput_rps"] <= p["throughput_rps"] + 1e-9
            assert p["verdict"] in ("meets", "misses", "inconclusive")
    text = (server_run / "report.txt").read_text()
    assert "latency against offered load" in text and "max rate at p90 ≤ 400 ms" in text
    assert "bound at load" in text and "throughput ceiling" in text
    # the HTML page: the two panels a curve, and the numbers of summary.json
    page = (server_run / "report.html").read_text()
    keys = _data_keys(page)
    for c in curves.values():
        group = f"{c['workload']}|{c['target']}|server"
        rate = c["search"]["max_rate_rps"]
        assert keys[("max_rate_rps", group)] == ("none" if rate is None else f"{rate:.4g}")
        assert float(keys[("latency_floor_ms", group)]) == pytest.approx(c["bound"]["latency_floor_ms"], rel=1e-2)
        for p in c["points"]:
            assert float(keys[("throughput_rps", f"{group}|{p['rate_rps']}")]) == pytest.approx(p["throughput_rps"],
                                                                                                 rel=1e-3)
    assert page.count("class=\"chart load\"") == 2 * len(curves)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("chromium") is None, reason="no chromium on this machine (.ci/run installs it)")
def test_the_serving_panels_render_in_a_browser(server_run, tmp_path):
    """The page with its serving panels loads offline in headless chromium without a console
    message, its script runs, and every load panel is an SVG with its series drawn."""
    args = [shutil.which("chromium"), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=3000", "--dump-dom", (server_run / "report.html").as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert [line for line in done.stderr.splitlines() if "CONSOLE" in line] == []
    assert 'data-ready="1"' in done.stdout
    assert done.stdout.count('class="chart load"') == 4 and done.stdout.count('class="point"') >= 8


@pytest.mark.slow
def test_the_store_imports_the_serving_records(server_run, tmp_path):
    store = tmp_path / "s.sqlite"
    assert main(["store", "import", str(server_run), "--store", str(store)]) == 0
    db = sqlite3.connect(store)
    rows = db.execute("SELECT scenario, rate_rps, latency_ms FROM records WHERE phase = 'server'").fetchall()
    served = [r for r in _records(server_run) if r["phase"] == "server"]
    assert len(rows) == len(served) and all(s == "server" and lat is not None for s, _, lat in rows)
    assert {rate for _, rate, _ in rows} >= {4.0}
    gaps = db.execute("SELECT agreement_gap FROM records WHERE phase = 'steady' AND target = 'dohnuts'").fetchall()
    assert gaps and all(g == 0.0 or g < 1e-4 for (g,) in gaps)


def _data_keys(page: str) -> dict:
    found: dict = {}

    class Keys(HTMLParser):
        current = None

        def handle_starttag(self, tag, attrs):
            a = dict(attrs)
            self.current = (a["data-key"], a.get("data-group", "")) if "data-key" in a else None
            if self.current:
                found[self.current] = ""

        def handle_data(self, data):
            if self.current:
                found[self.current] += data

        def handle_endtag(self, tag):
            self.current = None

    Keys().feed(page)
    return {k: v.strip() for k, v in found.items()}


@pytest.mark.slow
def test_stream_and_offline_scenarios_and_a_point_short_of_its_minimums(tmp_path):
    common = ("targets: [dohnuts]\nmodel: tiny\nwarmup: 1\nrepeat: 3\nhalfwidth: 0\n"
              "shape: {requests: 2, questions: 2, seq_tokens: 64, candidates: 2, candidate_tokens: 2}\n"
              "agreement: {sample: 0}\n")
    (tmp_path / "stream.yaml").write_text("kind: text\n" + common +
                                          "scenario: stream\nserving: {min_requests: 12, min_duration_s: 0}\n")
    (tmp_path / "offline.yaml").write_text("kind: text\n" + common +
                                           "scenario: offline\nserving: {min_requests: 10, min_duration_s: 0}\n")
    (tmp_path / "trace.jsonl").write_text("".join(json.dumps({"arrival_s": 0.05 * i}) + "\n" for i in range(5)))
    (tmp_path / "short.yaml").write_text("kind: text\n" + common + "scenario: server\n"
                                         "serving: {arrivals: trace.jsonl, min_requests: 10, min_duration_s: 0}\n")
    files = [str(tmp_path / f) for f in ("stream.yaml", "offline.yaml", "short.yaml")]
    assert main(["run", *files, "--out", str(tmp_path / "runs"), "--quiet"]) == 0
    (run_dir,) = list((tmp_path / "runs").iterdir())
    records = _records(run_dir)
    stream = [r for r in records if r["workload"]["name"] == "stream" and r["phase"] == "stream"]
    assert len(stream) == 12 and all(r["extra"]["serving"]["rules"]["min_requests"] == 12 for r in stream)
    offline = [r for r in records if r["phase"] == "offline"]
    assert len(offline) == 10 and all(r["extra"]["serving"]["arrival_ms"] == 0.0 for r in offline)
    short = [r for r in records if r["workload"]["name"] == "short" and r["phase"] == "server"]
    assert len(short) == 5 and short[0]["extra"]["serving"]["point"]["arrivals"] == "trace:trace.jsonl"
    summary = json.loads((run_dir / "summary.json").read_text())["sections"]["serving"]
    (stream_row,) = summary["streams"]
    assert stream_row["requests"] == 12 and stream_row["valid"]
    curves = {c["workload"]: c for c in summary["curves"]}
    (off,) = curves["offline"]["points"]
    assert off["rate_rps"] is None and off["served"] == 10 and off["throughput_rps"] > 0 and off["valid"]
    (replay,) = curves["short"]["points"]
    assert replay["role"] == "replay" and not replay["valid"]
    assert replay["reasons"] == ["5 requests < the minimum 10"]  # marked invalid, not silently short
    assert math.isclose(replay["rate_rps"], 5 / 0.2)
    assert "INVALID: 5 requests < the minimum 10" in (run_dir / "report.txt").read_text()


@pytest.fixture(scope="module")
def concurrency_run(made_once):
    def make(out):
        assert main(["run", str(ROOT / "workloads" / "serving" / "text-tiny-concurrency.yaml"), "--out",
                     str(out / "runs"), "--quiet"]) == 0

    (run_dir,) = list((made_once("concurrency-run", make) / "runs").iterdir())
    return run_dir


@pytest.mark.slow
def test_closed_loop_and_bursty_points_end_to_end(concurrency_run):
    """workloads/serving/text-tiny-concurrency.yaml: a bursty open point (gamma gaps) and closed loops
    of 1 and 3 clients, then the search over clients, on dohnuts' pipelined server and transformers'
    serial one: every client waits for its answer before it sends again, nothing is refused, and the
    report, summary.json, the HTML page and the CSV export name the clients."""
    records = _records(concurrency_run)
    served = [r for r in records if r["phase"] == "server"]
    points: dict = {}
    for r in served:
        s = r["extra"]["serving"]
        points.setdefault((r["target"], s["point"]["point"]), []).append(r)
    closed_seen = set()
    for (target, _), recs in points.items():
        facts = recs[0]["extra"]["serving"]["point"]
        assert facts["dropped"] == 0 and facts["served"] == len(recs)
        if facts.get("concurrency") is None:
            assert facts["arrivals"] == "gamma(burstiness=0.5)" and facts["rate_rps"] == 4.0
            assert all("client" not in r["extra"]["serving"] for r in recs)
            continue
        n = facts["concurrency"]
        closed_seen.add((target, n, facts["role"]))
        assert facts["arrivals"] == "closed-loop" and facts["think_ms"] == 20.0 and facts["queue"] is None
        clients = {r["extra"]["serving"]["client"] for r in recs}
        assert clients <= set(range(n)) and len(clients) == n
        for c in clients:  # a client's next request leaves after its previous answer
            mine = sorted((r["extra"]["serving"] for r in recs if r["extra"]["serving"]["client"] == c),
                          key=lambda s: s["arrival_ms"])
            assert all(b["arrival_ms"] >= a["completion_ms"] - 1e-6 for a, b in zip(mine, mine[1:]))
        assert facts["rate_rps"] == pytest.approx(facts["offered"] / facts["duration_s"])
    for target in ("dohnuts", "transformers"):
        assert {(target, 1, "fixed"), (target, 3, "fixed")} <= closed_seen
        assert any(t == target and role == "search" for t, _, role in closed_seen)
    summary = json.loads((concurrency_run / "summary.json").read_text())["sections"]["serving"]
    curves = {(c["target"], c["closed_loop"]): c for c in summary["curves"]}
    assert set(curves) == {("dohnuts", False), ("dohnuts", True), ("transformers", False), ("transformers", True)}
    page_keys = _data_keys((concurrency_run / "report.html").read_text())
    for target in ("dohnuts", "transformers"):
        closed = curves[(target, True)]
        assert [p["concurrency"] for p in closed["points"] if p["role"] == "fixed"] == [1, 3]
        most = closed["search"]["max_concurrency"]
        assert closed["search"]["max_rate_rps"] is None and (most is None or isinstance(most, int))
        assert "client" in closed["search"]["words"]
        group = f"text-tiny-concurrency|{target}|server|closed-loop"
        assert page_keys[("max_concurrency", group)] == ("none" if most is None else str(most))
        for p in closed["points"]:
            assert float(page_keys[("throughput_rps", f"{group}|{p['concurrency']}")]) == pytest.approx(
                p["throughput_rps"], rel=1e-3)
        assert [p["concurrency"] for p in curves[(target, False)]["points"]] == [None]
    text = (concurrency_run / "report.txt").read_text()
    assert "closed loop (think 20 ms), latency against clients" in text and "most clients at p90 ≤ 400 ms" in text
    assert "arrivals: gamma(burstiness=0.5)" in text
    assert (concurrency_run / "report.html").read_text().count('class="chart load"') == 2 * len(curves)
    import csv
    import io

    from dohnuts.bench.analysis.records import read_records
    from dohnuts.bench.report.export_formats import csv_text

    rows = list(csv.DictReader(io.StringIO(csv_text(read_records(concurrency_run / "results.jsonl")))))
    closed_rows = [r for r in rows if r["concurrency"]]
    assert len(closed_rows) == sum(1 for r in served if "client" in r["extra"]["serving"])
    assert {r["concurrency"] for r in closed_rows} >= {"1", "3"}


@pytest.mark.slow
def test_a_point_s_metrics_carry_vllms_names(concurrency_run):
    """Each load point of summary.json names its latencies as `vllm bench serve` does — mean_, median_,
    std_ and pNN_ of e2el_ms (arrival → response), ttft_ms (arrival → scores on the host) and queue_ms
    — each equal to what the point's records give by the one quantile method."""
    import numpy as np

    records = [r for r in _records(concurrency_run) if r["phase"] == "server"]
    summary = json.loads((concurrency_run / "summary.json").read_text())["sections"]["serving"]
    checked = 0
    for c in summary["curves"]:
        for p in c["points"]:
            mine = [r["extra"]["serving"] for r in records if r["target"] == c["target"]
                    and r["extra"]["serving"]["point"].get("concurrency") == p["concurrency"]
                    and r["extra"]["serving"]["point"]["role"] == p["role"]
                    and r["extra"]["serving"]["point"]["rate_rps"] == p["rate_rps"]]
            e2el = [s["latency_ms"] for s in mine]
            ttft = [s["first_byte_ms"] - s["arrival_ms"] for s in mine]
            assert p["served"] == len(mine) and p["dropped"] == 0
            assert p["mean_e2el_ms"] == pytest.approx(np.mean(e2el)) and p["std_e2el_ms"] == pytest.approx(
                np.std(e2el, ddof=1))
            assert p["median_e2el_ms"] == pytest.approx(np.quantile(e2el, 0.5)) == p["p50_ms"]
            assert p["p99_e2el_ms"] == pytest.approx(np.quantile(e2el, 0.99)) == pytest.approx(p["p99_ms"])
            assert p["p90_ttft_ms"] == pytest.approx(np.quantile(ttft, 0.9))
            assert p["mean_queue_ms"] == pytest.approx(np.mean([s["queue_ms"] for s in mine]))
            assert 0 <= p["median_ttft_ms"] <= p["median_e2el_ms"]
            checked += 1
    assert checked >= 6


@pytest.mark.slow
def test_the_pytorch_export_carries_the_points_vllm_metrics(concurrency_run):
    import msgspec

    from dohnuts.bench.analysis.records import read_records
    from dohnuts.bench.report.export_formats import PyTorchRecord, pytorch_records

    got = msgspec.convert(pytorch_records(read_records(concurrency_run / "results.jsonl"), {}), list[PyTorchRecord])
    summary = json.loads((concurrency_run / "summary.json").read_text())["sections"]["serving"]
    served = [r for r in got if r.benchmark.name == "dohnuts-bench serving"]
    for c in summary["curves"]:
        for p in c["points"]:
            mine = {r.metric.name: r.metric.benchmark_values[0] for r in served if r.model.backend == c["target"]
                    and r.benchmark.extra_info.get("concurrency") == p["concurrency"]
                    and r.benchmark.extra_info["role"] == p["role"]
                    and r.benchmark.extra_info.get("request_rate", p["rate_rps"]) == p["rate_rps"]}
            assert mine["mean_e2el_ms"] == p["mean_e2el_ms"] and mine["p99_ttft_ms"] == p["p99_ttft_ms"]
            assert mine["request_throughput"] == p["throughput_rps"] and mine["completed"] == p["served"]
    assert {r.benchmark.extra_info.get("concurrency") for r in served} >= {1, 3}
