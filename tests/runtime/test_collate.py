"""collate(): a request plan's token rows, candidate table, score positions and rewards, by hand."""

from __future__ import annotations

from dataclasses import replace

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

    with pytest.raises(RequestError, match=r"request .r.: field .questions\[1\].: training data needs"):
        collate(_plan(rewards=((1.0, 0.0), None)), pad_id=PAD, train=True)


def test_the_common_prefix_is_counted_once_and_right():
    """The work record's common prefix: 3 tokens by hand (1, 2, 3), computed by collate when the
    plan does not carry it, taken from the plan when it does (the planner computes it once)."""
    from dohnuts.config import preset
    from dohnuts.runtime.plan import plan_request
    from dohnuts.runtime.tokenizer import ByteTokenizer

    assert collate(_plan(), pad_id=PAD).work.common_prefix_len == 3
    assert collate(replace(_plan(), common_prefix_len=2), pad_id=PAD).work.common_prefix_len == 2
    tok = ByteTokenizer(preset("tiny"))
    req = Request("r", (Question("a", "same start, then a", ("x",)), Question("b", "same start, then b", ("x",))))
    plan = plan_request(req, tok, max_len=512)
    head = len(tok.encode("Question: same start, then "))
    assert plan.common_prefix_len == head


def _plain_collate(plan: RequestPlan, pad_id: int, shape=None) -> dict:
    """The batch tensors one element at a time, straight from their definitions."""
    P = plan.prefix_len
    rows = [list(s[P:]) for s in plan.sequences]
    B_pass, L = shape or (len(rows), max(len(r) for r in rows))
    kmax = max(len(pos) for pos in plan.score_positions)
    ids = [[pad_id] * L for _ in range(B_pass)]
    grid = [[0] * kmax for _ in range(B_pass)]
    cand, score_index, slots = [], [], []
    for qi, pos in enumerate(plan.score_positions):
        ids[qi][: len(rows[qi])] = rows[qi]
        cand.append([])
        for j in range(kmax):
            grid[qi][j] = pos[min(j, len(pos) - 1)] - P
            if j < len(pos):
                cand[qi].append(len(score_index))
                score_index.append(qi * L + pos[j] - P)
                slots.append(qi * kmax + j)
            else:
                cand[qi].append(-1)
    return {"ids": ids, "cand_matrix": cand, "score_index": score_index, "score_rows": grid, "score_slot": slots,
            "prefix_ids": [list(plan.sequences[0][:P])] if P else None,
            "score_keys": sum(p + 1 for pos in plan.score_positions for p in pos)}


def test_collate_equals_a_plain_reference_on_random_requests():
    """Random requests through the planner — ragged candidate counts, multi-byte text, with and
    without a prefix, image tokens (ids past the byte range), shared or not, in a graph bucket or
    not — collate to exactly the tensors of the element-by-element definition."""
    import random

    from dohnuts.config import preset
    from dohnuts.runtime.plan import plan_request
    from dohnuts.runtime.tokenizer import ByteTokenizer

    tok, rng = ByteTokenizer(preset("tiny")), random.Random(0)

    def text(n: int) -> str:
        return "".join(rng.choice("abc dé€") for _ in range(n))

    splits = 0
    for trial in range(60):
        qs = tuple(Question(f"q{q}", text(rng.randint(0, 30)),
                            tuple(text(rng.randint(0, 5)) for _ in range(rng.randint(1, 4))))
                   for q in range(rng.randint(1, 5)))
        req = Request("r", qs, prefix=text(rng.randint(1, 40)) if trial % 2 else None)
        plan = plan_request(req, tok, max_len=1024, image_tokens=rng.choice([0, 6]))
        # collate takes any split the planner could make (on any grid): every one ≤ the common
        # prefix and the first candidate, here on an 8-token grid so that short requests split too
        cap = min(plan.common_prefix(), min(p[0] for p in plan.score_positions)) if len(qs) > 1 else 0
        for pl in {replace(plan, prefix_len=cap - cap % 8), replace(plan, prefix_len=0)}:
            splits += pl.prefix_len > 0
            L = max(pl.lengths) - pl.prefix_len
            for shape in (None, (len(pl.sequences) + rng.randint(0, 2), L + rng.randint(0, 9))):
                hb = collate(pl, pad_id=PAD, shape=shape)
                want = _plain_collate(pl, PAD, shape)
                for name in ("ids", "cand_matrix", "score_index", "score_rows", "score_slot", "prefix_ids"):
                    got = getattr(hb.tensors, name)
                    if want[name] is None:
                        assert got is None
                        continue
                    assert got.dtype == torch.long and got.is_contiguous(), name
                    assert got.tolist() == want[name], name
                assert hb.work.candidates == len(want["score_index"])
                assert hb.work.score_keys == want["score_keys"]
                assert hb.work.scored_rows == len(want["score_rows"]) * len(want["score_rows"][0])
    assert splits > 20  # the shared-prefix layout is exercised, not only the single pass


@pytest.mark.parametrize("prefix_len", [0, 3])
def test_a_packed_batch_holds_the_same_tensors_in_one_buffer(prefix_len):
    """`Batch.packed` (what `pin` does with page-locked memory): every integer tensor becomes a
    view of one buffer with its own values and shape, the float ones stay apart, and `to` — one
    copy of the buffer, then views — gives the tensors of the per-tensor copy; a `replace`d batch
    (no buffer) still moves right."""
    from dataclasses import fields

    t = collate(_plan(prefix_len=prefix_len), pad_id=PAD, shape=(4, 8)).tensors
    p = t.packed()
    buf, layout = p.__dict__["_packed"]
    longs = [f.name for f in fields(t) if isinstance(getattr(t, f.name), torch.Tensor)
             and getattr(t, f.name).dtype == torch.long]
    assert set(layout) == set(longs) and buf.numel() == sum(getattr(t, n).numel() for n in longs)
    assert {getattr(p, n).untyped_storage().data_ptr() for n in longs} == {buf.untyped_storage().data_ptr()}
    for q in (p, p.to(torch.device("cpu")), replace(p, image_tokens=p.image_tokens).to(torch.device("cpu"))):
        for f in fields(t):
            want, got = getattr(t, f.name), getattr(q, f.name)
            if isinstance(want, torch.Tensor):
                assert got.dtype == want.dtype and torch.equal(got, want), f.name
            else:
                assert got == want, f.name
    assert p.rewards.untyped_storage().data_ptr() != buf.untyped_storage().data_ptr()


@pytest.mark.parametrize("prefix_len", [0, 3])
def test_collate_writes_every_integer_tensor_into_one_buffer_from_allocate(prefix_len):
    """collate packs as it builds: ONE call of `allocate` with the integer tensors' total size,
    each tensor at its layout offset holding its own values (against `Batch.packed` of the same
    batch), `to` moving the buffer in one copy, and `without_patches`/`pin` keeping the buffer."""
    from dataclasses import fields

    from dohnuts.runtime.batch import without_patches

    asked = []

    def allocate(n):
        asked.append(n)
        return torch.full((n,), -7, dtype=torch.long)  # nothing may stay unwritten

    positions = torch.arange(3 * 11).view(3, 11)  # an image request's (3, T) positions
    hb = collate(_plan(prefix_len=prefix_len), pad_id=PAD, shape=(4, 8), positions=positions, allocate=allocate)
    t = hb.tensors
    buf, layout = t.__dict__["_packed"]
    repacked = t.packed()
    _, want_layout = repacked.__dict__["_packed"]
    assert asked == [buf.numel()] and list(layout) == list(want_layout)
    assert buf.numel() == sum(s.numel() for _, s in layout.values()) and not (buf == -7).any()
    for name, (offset, shape) in layout.items():  # torch views of the buffer: a copy from one records its block
        got = getattr(t, name)
        assert got.shape == shape and torch.equal(buf[offset:offset + shape.numel()].view(shape), got), name
        assert got.untyped_storage().data_ptr() == buf.untyped_storage().data_ptr(), name
        assert torch.equal(got, getattr(repacked, name)), name
    assert t.positions.tolist() == positions[:, :prefix_len + 8].unsqueeze(1).tolist()
    for q in (t.to(torch.device("cpu")), without_patches(hb).tensors, without_patches(hb).tensors.to(torch.device("cpu"))):
        for f in fields(t):
            want, got = getattr(t, f.name), getattr(q, f.name)
            assert (torch.equal(got, want) if isinstance(want, torch.Tensor) else got == want), f.name
    assert without_patches(hb).tensors.__dict__["_packed"][0] is buf
    moved, layout_moved = t.to(torch.device("cpu")).__dict__["_packed"]  # the moved batch names its buffer
    assert layout_moved is layout and torch.equal(moved, buf)
    with pytest.raises(ValueError, match="views of the packed buffer"):
        t.keeping_buffer(ids=t.ids.clone())
