"""collate(): a request plan's token rows, candidate table, score positions and rewards, by hand."""

from __future__ import annotations

import pytest
import torch

from dohnuts.runtime.batch import collate
from dohnuts.runtime.plan import RequestPlan
from dohnuts.runtime.requests import Question, Request

PAD = 99


def _plan(prefix_len: int = 0, rewards=((1.0, 0.0), (0.0, 0.0, 1.0))) -> RequestPlan:
    qs = (Question("a", "?", ("x", "y"), rewards[0]), Question("b", "?", ("x", "y", "z"), rewards[1]))
    seqs = ((1, 2, 3, 4, 5, 6), (1, 2, 3, 7, 8, 9, 10, 11))
    score = ((4, 5), (5, 6, 7))  # absolute positions of each candidate's score token
    return RequestPlan(Request("r", qs), seqs, score, prefix_len=prefix_len)


def test_rows_candidates_and_rewards_by_hand():
    hb = collate(_plan(), pad_id=PAD)
    t = hb.tensors
    assert t.ids.tolist() == [[1, 2, 3, 4, 5, 6, PAD, PAD], [1, 2, 3, 7, 8, 9, 10, 11]]
    assert t.cand_matrix.tolist() == [[0, 1, -1], [2, 3, 4]]  # index into score_index, -1 = none
    assert t.score_index.tolist() == [4, 5, 8 + 5, 8 + 6, 8 + 7]  # row · L + position
    assert t.rewards.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]] and t.rewards.dtype == torch.float32
    assert t.prefix_ids is None


def test_a_shared_prefix_and_a_bucket_shift_the_positions():
    hb = collate(_plan(prefix_len=3), pad_id=PAD, shape=(4, 8))  # a graph bucket: 4 rows × 8 tokens
    t = hb.tensors
    assert t.prefix_ids.tolist() == [[1, 2, 3]]
    assert t.ids.tolist() == [[4, 5, 6] + [PAD] * 5, [7, 8, 9, 10, 11] + [PAD] * 3, [PAD] * 8, [PAD] * 8]
    assert t.score_index.tolist() == [1, 2, 8 + 2, 8 + 3, 8 + 4]
    assert t.cand_matrix.tolist() == [[0, 1, -1], [2, 3, 4]]
    assert hb.work.padded_rows == 2 and hb.work.padded_len == 8
    with pytest.raises(ValueError, match="smaller than the batch"):
        collate(_plan(prefix_len=3), pad_id=PAD, shape=(1, 8))


def test_rewards_only_when_every_question_has_them():
    assert collate(_plan(rewards=(None, None)), pad_id=PAD).tensors.rewards is None
    from dohnuts.errors import RequestError

    with pytest.raises(RequestError, match="training needs"):
        collate(_plan(rewards=((1.0, 0.0), None)), pad_id=PAD, train=True)


def test_the_common_prefix_is_counted_once_and_right():
    """The work record's common prefix: 3 tokens by hand (1, 2, 3), computed by collate when the
    plan does not carry it, taken from the plan when it does (the planner computes it once)."""
    from dataclasses import replace

    from dohnuts.config import preset
    from dohnuts.runtime.plan import plan_request
    from dohnuts.runtime.tokenizer import ByteTokenizer

    assert collate(_plan(), pad_id=PAD).work.common_prefix_len == 3
    assert collate(replace(_plan(), common_prefix_len=2), pad_id=PAD).work.common_prefix_len == 2
    tok = ByteTokenizer(preset("tiny"))
    req = Request("r", (Question("a", "same start, then a", ("x",)), Question("b", "same start, then b", ("x",))))
    plan = plan_request(req, tok, max_len=512, min_shared=1)
    head = len(tok.encode("Question: same start, then "))
    assert plan.common_prefix_len == head
