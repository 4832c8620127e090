"""Property-based fuzzing of dohnuts-bench's three readers: workload files (load_workload with the
registered kinds and targets), hardware specs (parse_hwspec / load_hwspec) and raw JSONL records
(read_records, then check_reportable). Whatever they are fed — arbitrary YAML/JSON values, near-valid
documents with one field replaced, arbitrary bytes — they return a valid object or raise the
project's one-line error (ConfigError / RecordError, a DohnutsError) naming the file; never
another exception."""

from __future__ import annotations

import copy
import gzip
import json
import math
import os
import string
import warnings
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings, strategies as st

from dohnuts.bench.analysis.hwspec import HwSpec, load_hwspec, parse_hwspec
from dohnuts.bench.analysis.records import RecordError, check_reportable, read_records, record_from_dict, where
from dohnuts.bench.measure.workload import WorkloadSpec, load_workload
from dohnuts.errors import DohnutsError
from tests.bench.test_bench_harness import ROOT, _registry

# DOHNUTS_FUZZ_EXAMPLES=5000 for a longer search; the default keeps the file well under a minute in CI.
# derandomize: the same examples on every run (tests/conftest.py seeds every fuzzer so; issue 46).
FUZZ = settings(max_examples=int(os.environ.get("DOHNUTS_FUZZ_EXAMPLES", "150")), deadline=None, database=None,
                derandomize=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                                         HealthCheck.filter_too_much, HealthCheck.data_too_large])
KINDS, TARGETS = _registry()

# ---------------------------------------------------------------------------------------------
# Values


def _text(max_size: int = 12):
    # no surrogates (not encodable), otherwise anything: control characters, NUL, unicode
    return st.text(st.characters(blacklist_categories=("Cs",)), max_size=max_size)


NAMES = ["kind", "targets", "model", "device", "precision", "warmup", "repeat", "min_duration_s", "halfwidth",
         "max_repeat", "seed", "hwspec", "shape", "on_gpu", "name", "requires_gpu", "questions", "seq_tokens",
         "requests", "candidates", "candidate_tokens", "prefix_tokens", "resolution", "distinct_images",
         "duplicate_ratio", "cache", "text", "image", "tiny", "dohnuts", "transformers", "h200", "cold", "warm",
         "label", "options", "share_prefix", "lora_rank", "train-step", "image-cache", "shared-prefix", "bf16", ""]
SCALARS = st.one_of(
    st.none(), st.booleans(),
    st.integers(), st.integers(min_value=-2, max_value=70_000), st.integers(min_value=2**60, max_value=2**80),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(min_value=-1, max_value=1e6),
    st.sampled_from(NAMES), _text(),
)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(
    st.lists(inner, max_size=4),
    st.dictionaries(st.one_of(st.sampled_from(NAMES), _text(6), st.integers(-3, 3)), inner, max_size=5)),
    max_leaves=20)
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True, allow_infinity=True),
              st.sampled_from(NAMES), _text()),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.sampled_from(NAMES), _text(6)),
                                                                          inner, max_size=5)),
    max_leaves=20)


def _paths(doc) -> list[tuple]:
    """Every key path of a nested dict/list document (for replacing one field)."""
    out = [()]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += [(k, *p) for p in _paths(v)]
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += [(i, *p) for p in _paths(v)]
    return out


@st.composite
def mutated(draw, base: dict):
    """`base` with a few fields replaced by arbitrary values, deleted, or added."""
    doc = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(doc) if p]
        if not paths or not isinstance(doc, dict):
            break
        path = draw(st.sampled_from(paths))
        parent = doc
        for k in path[:-1]:
            parent = parent[k]
        action = draw(st.sampled_from(["replace", "replace", "delete", "add"]))
        if action == "replace":
            parent[path[-1]] = draw(VALUES)
        elif action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.one_of(st.sampled_from(NAMES), _text(6)))] = draw(VALUES)
    return doc


def _write_yaml(path: Path, doc) -> bool:
    try:
        path.write_text(yaml.safe_dump(doc, allow_unicode=True), encoding="utf-8")
    except (yaml.YAMLError, UnicodeEncodeError, RecursionError):
        return False
    return True


YAMLISH = st.text(alphabet=string.ascii_letters[:6] + string.digits[:4] + " \t\n:-,[]{}&*!|>'\"#%@`?<.~\\\x00\x07é",
                  max_size=120)

# ---------------------------------------------------------------------------------------------
# Workload files


def _check_workload(path: Path, gpu: bool) -> None:
    try:
        spec = load_workload(path, KINDS, TARGETS, gpu=gpu)
    except DohnutsError as exc:
        assert exc.source == str(path), f"the error must name the workload file: {exc}"
        assert "\n" not in str(exc), f"not one line: {exc!r}"
        return
    assert isinstance(spec, WorkloadSpec) and spec.kind in KINDS and spec.targets
    assert spec.repeat >= 1 and math.isfinite(spec.min_duration_s)
    json.dumps(spec.to_dict(), allow_nan=False, default=str)


VALID_WORKLOAD = {
    "kind": "image", "targets": ["dohnuts", {"name": "dohnuts", "label": "unshared", "options": {"share_prefix": False}}],
    "model": "tiny", "warmup": 1, "repeat": 2, "min_duration_s": 0.5, "halfwidth": 0.1, "seed": 3,
    "shape": {"requests": 2, "questions": 2, "seq_tokens": 128, "candidates": 2, "candidate_tokens": 3,
              "resolution": [[256, 256], [64, 512]], "distinct_images": 2, "duplicate_ratio": 0.5},
    "on_gpu": {"model": "qwen3.5-2b", "shape": {"questions": 8, "seq_tokens": 512}},
}


@FUZZ
@given(doc=st.one_of(VALUES, st.dictionaries(st.sampled_from(NAMES), VALUES, max_size=6)), gpu=st.booleans())
def test_workload_reader_on_arbitrary_yaml_values(tmp_path_factory, doc, gpu):
    path = tmp_path_factory.mktemp("w") / "w.yaml"
    if _write_yaml(path, doc):
        _check_workload(path, gpu)


@FUZZ
@given(doc=st.one_of(mutated(VALID_WORKLOAD), mutated(yaml.safe_load((ROOT / "workloads" / "text.yaml").read_text())),
                     mutated(yaml.safe_load((ROOT / "workloads" / "train-step.yaml").read_text()))),
       gpu=st.booleans())
def test_workload_reader_on_near_valid_files(tmp_path_factory, doc, gpu):
    path = tmp_path_factory.mktemp("w") / "w.yaml"
    if _write_yaml(path, doc):
        _check_workload(path, gpu)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), YAMLISH.map(lambda t: t.encode("utf-8", "surrogatepass")),
                      st.binary(max_size=40).map(lambda b: b"kind: text\nshape: {questions: 2}\n" + b)),
       gpu=st.booleans())
def test_workload_reader_on_arbitrary_bytes(tmp_path_factory, data, gpu):
    path = tmp_path_factory.mktemp("w") / "w.yaml"
    path.write_bytes(data)
    _check_workload(path, gpu)


def test_the_valid_seed_documents_are_valid(tmp_path):
    path = tmp_path / "w.yaml"
    _write_yaml(path, VALID_WORKLOAD)
    assert load_workload(path, KINDS, TARGETS, gpu=True).shape.seq_tokens == 512


# ---------------------------------------------------------------------------------------------
# Hardware specs


VALID_HWSPEC = {
    "name": "Fuzz GPU", "device_names": ["Fuzz"], "target_fraction": 0.8, "overlap_compute_kinds": False,
    "ceilings": {
        "mm": {"kind": "compute", "provenance": "derived", "source": "test",
               "factors": {"units": 10, "clock_hz": "2e9", "flops_per_clock": 100}, "value": 2e12},
        "mem": {"kind": "bandwidth", "provenance": "datasheet", "source": "test", "value": 1e12, "unit": "B/s"},
        "mm_m": {"kind": "compute", "provenance": "measured", "source": "test", "value": 1.5e12, "date": "2026-11-30"},
    },
    "roles": {"bf16": {"matrix": "mm", "attention": "mm", "scan": "mm", "vector": "mm", "memory": "mem",
                       "host_link": "mem"}},
    "measured_roles": {"bf16": {"matrix": "mm_m"}},
}


def _check_hwspec_value(doc) -> None:
    try:
        spec = parse_hwspec(doc, source="fuzz.yaml")
    except DohnutsError as exc:
        assert exc.source == "fuzz.yaml" and "\n" not in str(exc), repr(exc)
        return
    assert isinstance(spec, HwSpec)
    for c in spec.ceilings.values():
        assert math.isfinite(c.value) and c.value > 0


@FUZZ
@given(doc=st.one_of(VALUES, mutated(VALID_HWSPEC), mutated(VALID_HWSPEC)))
def test_hwspec_parser_on_arbitrary_values(doc):
    _check_hwspec_value(doc)


@FUZZ
@given(data=st.one_of(st.binary(max_size=200), YAMLISH.map(lambda t: t.encode("utf-8", "surrogatepass")),
                      mutated(VALID_HWSPEC).map(lambda d: yaml.safe_dump(d, allow_unicode=True).encode())))
def test_hwspec_reader_on_arbitrary_files(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("h") / "gpu.yaml"
    path.write_bytes(data)
    try:
        spec = load_hwspec(path)
    except DohnutsError as exc:
        assert str(path) in str(exc) and "\n" not in str(exc), repr(exc)
        return
    assert isinstance(spec, HwSpec)


def test_the_valid_hwspec_is_valid():
    assert parse_hwspec(copy.deepcopy(VALID_HWSPEC), source="x").has_measured("bf16")


# ---------------------------------------------------------------------------------------------
# Raw JSONL records


def _real_record() -> dict:
    """A real record of a committed run (the schema the harness writes)."""
    path = ROOT / "tests" / "bench" / "fixtures" / "h200-text-shared" / "results.jsonl.gz"
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return json.loads(f.readline())


RECORD = _real_record()


def _check_jsonl(path: Path) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            records = read_records(path)
    except DohnutsError as exc:  # the file, or the file and the line
        assert exc.source in (str(path), *(f"{path}:{n}" for n in range(1, 6))) and "\n" not in str(exc), repr(exc)
        return
    for rec in records:
        assert rec.schema == 2 and where(rec).startswith(f"{path}:")
        try:
            check_reportable(rec)
        except RecordError as exc:
            assert exc.source == where(rec) and "\n" not in str(exc), repr(exc)


@FUZZ
@given(lines=st.lists(st.one_of(JSON_VALUES, mutated(RECORD), mutated(RECORD)), max_size=4), tail=st.binary(max_size=8))
@pytest.mark.slow
def test_jsonl_reader_on_arbitrary_json_lines(tmp_path_factory, lines, tail):
    path = tmp_path_factory.mktemp("j") / "results.jsonl"
    text = "\n".join(json.dumps(x) for x in lines)  # allow_nan: bare NaN / Infinity, as a foreign writer might
    path.write_bytes(text.encode() + (b"\n" + tail if tail else b""))
    _check_jsonl(path)


@FUZZ
@given(data=st.one_of(st.binary(max_size=300),
                      st.text(alphabet='{}[]":,0123456789.eE-+ \ntruefalsnNaIiy\\u', max_size=200).map(str.encode)))
def test_jsonl_reader_on_arbitrary_bytes(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("j") / "results.jsonl"
    path.write_bytes(data)
    _check_jsonl(path)


@FUZZ
@given(rec=st.one_of(mutated(RECORD), st.dictionaries(st.sampled_from(list(RECORD) + ["schema"]), JSON_VALUES)))
def test_check_record_on_arbitrary_records(rec):
    rec.setdefault("schema", 1)
    try:
        check_reportable(record_from_dict(rec))
    except RecordError as exc:
        assert "\n" not in str(exc), repr(exc)


def test_the_real_record_is_valid():
    check_reportable(record_from_dict(copy.deepcopy(RECORD)))
