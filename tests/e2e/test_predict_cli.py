"""`dohnuts predict`: scores a file, reports bad lines by number, loses nothing."""

from __future__ import annotations

import json

import torch

import dohnuts.api as api
from dohnuts.cli import main
from dohnuts.runtime.requests import Question, Request

GOOD = {"id": "r1", "prefix": "colours", "questions": [{"id": "q1", "text": "Which is red?", "candidates": ["red", "green"]},
                                                       {"id": "q2", "text": "Which is blue?", "candidates": ["a", "b", "blue"]}]}


def test_predict_api_returns_probabilities_and_choice():
    model = api.load("tiny")
    req = Request(id="r", questions=(Question("q", "pick", ("x", "yy", "zzz")),))
    (res,) = model.predict([req])
    q = res.questions[0]
    assert len(q.scores) == 3 and abs(sum(q.probabilities) - 1) < 1e-6
    assert q.choice == max(range(3), key=lambda i: q.scores[i])
    expect = torch.softmax(torch.tensor(q.scores) / model.temperature, 0)
    assert torch.allclose(torch.tensor(q.probabilities), expect, atol=1e-6)


def test_each_question_lists_its_own_candidates_scores_in_order():
    """Questions of 2, 4 and 1 candidates in one request: each result lists the head's score of each
    of its candidates in order (the scores of the pass, read through the candidate matrix), their
    softmax and its argmax — nothing of another question's, no padding."""
    from dohnuts.runtime.predict import Predictor

    model = api.load("tiny")
    req = Request(id="r", questions=(Question("a", "two?", ("x", "yy")), Question("b", "four?", ("p", "qq", "r", "ss")),
                                     Question("c", "one?", ("only",))))
    pred = Predictor(model)
    try:
        hb = pred.prepare(req)
        dev, ready = pred.pipeline.transfer(hb)
        with torch.inference_mode():
            raw, _ = model.score(hb, dev)
        res, _ = pred.call(req)
    finally:
        pred.close()
    cand = hb.tensors.cand_matrix.tolist()
    for qi, (q, n) in enumerate(zip(res.questions, (2, 4, 1))):
        want = [raw[cand[qi][j]].item() for j in range(n)]
        assert q.scores == want and len(q.probabilities) == n
        assert q.choice == max(range(n), key=lambda i: want[i])
        expect = torch.softmax(torch.tensor(want) / model.temperature, 0)
        assert torch.allclose(torch.tensor(q.probabilities), expect, atol=1e-6)


def test_bad_lines_reported_and_rest_scored(tmp_path, capsys):
    lines = [
        json.dumps(GOOD),
        "{not json",
        json.dumps({"id": "r3", "questions": [{"id": "q", "text": "x?", "candidates": []}]}),
        json.dumps({"id": "r4", "questions": [{"id": "q", "text": "  ", "candidates": ["a"]}]}),
        json.dumps({"id": "r5", "questions": [{"id": "q", "text": "long?", "candidates": ["y" * 9000]}]}),
        json.dumps({**GOOD, "id": "r6"}),
    ]
    src = tmp_path / "requests.jsonl"
    src.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out.jsonl"
    code = main(["predict", "--model", "tiny", str(src), "-o", str(out)])
    assert code == 2
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r.get("id") for r in records][0] == "r1" and records[-1]["id"] == "r6"
    errors = {r["line"]: r["error"] for r in records if "error" in r}
    assert set(errors) == {2, 3, 4, 5}
    assert "malformed JSON" in errors[2]
    assert "requests.jsonl:3: field 'questions[0].candidates': is empty" in errors[3]
    assert "field 'questions[0].text': is empty" in errors[4]
    assert "over the context of 8192" in errors[5]
    good = [r for r in records if "questions" in r]
    assert len(good) == 2 and good[0]["questions"] == good[1]["questions"]  # same request, same scores
    err = capsys.readouterr().err
    assert "scored 2 of 6 requests, refused 4" in err


def test_missing_file_one_line_error(tmp_path, capsys):
    code = main(["predict", str(tmp_path / "nope.jsonl")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nope.jsonl: does not exist" in err[0]


def test_unknown_model_one_line_error(tmp_path, capsys):
    src = tmp_path / "r.jsonl"
    src.write_text(json.dumps(GOOD) + "\n")
    assert main(["predict", "--model", "gigantic", str(src)]) == 2
    assert "unknown preset 'gigantic'" in capsys.readouterr().err


def test_a_result_line_round_trips_every_float_and_writes_non_finite_as_null():
    """`RequestResult.to_json` (msgspec): one line, every score and probability back exactly, a
    non-finite score as null (valid JSON, unlike json's NaN)."""
    import json
    import random

    import msgspec

    from dohnuts.runtime.predict import QuestionResult, RequestResult

    rng = random.Random(0)
    qs = [QuestionResult(id=f"q{i}", scores=[rng.gauss(0, 10) for _ in range(4)],
                         probabilities=[rng.random() for _ in range(4)], choice=i % 4) for i in range(8)]
    line = RequestResult("r", qs).to_json()
    assert "\n" not in line
    assert json.loads(line) == {"id": "r", "questions": [msgspec.structs.asdict(q) for q in qs]}
    bad = RequestResult("r", [QuestionResult("q", [float("nan"), float("inf")], [0.5, 0.5], 0)]).to_json()
    assert json.loads(bad)["questions"][0]["scores"] == [None, None]
