"""A checkpoint's `tokenizer.json` (HFTokenizer) beside the presets' byte tokenizer: its special ids,
`encode_many` against one `encode` a text, a request's plan built by hand from per-string encodes,
and a file that is not a tokenizer refused naming it."""

from __future__ import annotations

import random

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from dohnuts.config import preset
from dohnuts.errors import CheckpointError, RequestError
from dohnuts.runtime.plan import plan_request
from dohnuts.runtime.requests import Question, Request
from dohnuts.runtime.tokenizer import ByteTokenizer, HFTokenizer, tokenizer_for
from tests.reference import relative_error

TEXTS = ["Question: which is larger?\n", "Answer: 12", "Answer:  two  spaces", "", " ", "\n\n",
         "Answer: naïve café — ünïcödé ✓ 東京", "Answer: <|im_end|> inside", "Answer: " + "ab" * 300]


def _bpe(folder, vocab_size: int):
    """A byte-level BPE `tokenizer.json` (Qwen's kind of tokenizer, its end-of-turn and end-of-text
    tokens added as specials) of `vocab_size` ids, trained on random words, written into `folder`."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghij klmnop") for _ in range(rng.randint(1, 8))) for _ in range(300)]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        [" ".join(rng.choice(words) for _ in range(30)) for _ in range(200)] + TEXTS,
        trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_end|>"],
                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    return folder


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A checkpoint folder holding a BPE of 600 ids (more than the tiny preset's 264)."""
    return _bpe(tmp_path_factory.mktemp("checkpoint"), 600)


def test_a_checkpoint_folder_with_a_tokenizer_json_gets_it_with_its_special_ids(checkpoint):
    cfg = preset("tiny")
    tok = tokenizer_for(cfg, checkpoint)
    assert isinstance(tok, HFTokenizer) and tok.name == "tokenizer.json"
    raw = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    assert tok.special.score == raw.token_to_id("<|im_end|>")
    assert tok.special.pad == raw.token_to_id("<|endoftext|>")
    assert tok.special.image == cfg.image_token_id
    assert isinstance(tokenizer_for(cfg, None), ByteTokenizer)
    assert isinstance(tokenizer_for(cfg, checkpoint.parent), ByteTokenizer)  # no tokenizer.json there


@pytest.mark.parametrize("kind", ["tokenizer.json", "bytes"])
def test_encode_many_is_one_encode_a_text_in_order(checkpoint, kind):
    tok = HFTokenizer(checkpoint / "tokenizer.json", preset("tiny")) if kind == "tokenizer.json" else ByteTokenizer(
        preset("tiny"))
    many = tok.encode_many(TEXTS)
    assert many == [tok.encode(t) for t in TEXTS]
    assert len(many) == len(TEXTS) and many[1] and many[3] == []
    assert tok.encode_many([]) == []
    assert many[0] is not many[1] and all(type(m) is list for m in many)  # new lists: the plan extends them


def _plan_by_hand(req: Request, tok, image_tokens: int = 0):
    """The token layout of dohnuts.runtime.plan's docstring, one `encode` a string."""
    sp = tok.special
    head = [sp.vision_start] + [sp.image] * image_tokens + [sp.vision_end] if image_tokens else []
    if req.prefix:
        head += tok.encode(req.prefix + "\n")
    seqs, positions = [], []
    for q in req.questions:
        seq = head + tok.encode(f"Question: {q.text}\n")
        pos = []
        for cand in q.candidates:
            seq += tok.encode(f"Answer: {cand}") + [sp.score]
            pos.append(len(seq) - 1)
        seqs.append(tuple(seq))
        positions.append(tuple(pos))
    return tuple(seqs), tuple(positions)


@pytest.mark.parametrize("prefix,image_tokens", [("", 0), ("A long shared context about klm nop. " * 20, 0),
                                                 ("ctx", 16)])
def test_a_requests_plan_with_a_checkpoint_tokenizer_is_the_layout_by_hand(checkpoint, prefix, image_tokens):
    tok = HFTokenizer(checkpoint / "tokenizer.json", preset("tiny"))
    rng = random.Random(len(prefix) + image_tokens)
    qs = tuple(Question(f"q{i}", f"which of these {rng.randint(0, 99)} fits ✓?",
                        tuple(f"option {rng.choice('abcdefg')} {j}" for j in range(rng.randint(1, 5))))
               for i in range(7))
    req = Request("r", qs, prefix=prefix)
    plan = plan_request(req, tok, max_len=100_000, image_tokens=image_tokens)
    seqs, positions = _plan_by_hand(req, tok, image_tokens)
    assert plan.sequences == seqs
    assert plan.score_positions == positions
    assert all(seq[p] == tok.special.score for seq, pos in zip(seqs, positions) for p in pos)


def test_the_context_limit_names_the_field_that_filled_it_with_a_checkpoint_tokenizer(checkpoint):
    tok = HFTokenizer(checkpoint / "tokenizer.json", preset("tiny"))
    q = Question("q", "short?", ("one", "two " * 200, "three"))
    fits = len(_plan_by_hand(Request("r", (Question("q", "short?", ("one",)),)), tok)[0][0])
    with pytest.raises(RequestError, match=r"field .questions\[0\]\.candidates\[1\]."):
        plan_request(Request("r", (q,)), tok, max_len=fits + 20)
    with pytest.raises(RequestError, match=r"field .questions\[0\]\.text."):
        plan_request(Request("r", (q,)), tok, max_len=4)


def test_a_file_that_is_not_a_tokenizer_or_lacks_the_end_tokens_is_refused_naming_it(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{not json")
    with pytest.raises(CheckpointError, match=r"tokenizer\.json.*cannot be read as a tokenizer"):
        HFTokenizer(bad, preset("tiny"))
    plain = Tokenizer(models.WordLevel({"a": 0, "[UNK]": 1}, unk_token="[UNK]"))
    plain.save(str(bad))
    with pytest.raises(CheckpointError, match=r"tokenizer\.json.*no <\|im_end\|> or <\|endoftext\|> token"):
        HFTokenizer(bad, preset("tiny"))


def test_a_checkpoint_with_a_tokenizer_json_predicts_as_its_questions_alone_and_unshared(checkpoint, tmp_path):
    """End to end through `dohnuts.load(...).predict`: a tiny text checkpoint beside a BPE
    `tokenizer.json` — refused while the tokenizer has more ids than the model's vocabulary, then one
    that fits. A request whose prefix is shared (computed once, forked) scores as each of its
    questions alone (no prefix shared) and as the measurement-only unshared plan."""
    import shutil

    import dohnuts.api as api
    from tests.model.test_checkpoint import _tiny_checkpoint
    from tests.reference import scores_of, unshared

    root = _tiny_checkpoint(tmp_path / "ckpt")
    shutil.copy(checkpoint / "tokenizer.json", root / "tokenizer.json")  # 600 ids: over the tiny's 264
    with pytest.raises(CheckpointError, match=r"config\.json: field 'vocab_size': is 264, but the largest id of "
                                              r"its tokenizer \(tokenizer\.json\) is 599"):
        api.load(str(root), device="cpu")
    _bpe(root, 262)  # 256 bytes, the two end tokens and 4 merges: ids below 264
    session = api.load(str(root), device="cpu")
    assert isinstance(session.tokenizer, HFTokenizer)
    qs = tuple(Question(f"q{i}", f"case {i}: which one?", ("alpha", "beta gamma", "delta")) for i in range(6))
    req = Request("r", qs, prefix="shared context, klm nop abc " * 12)
    hb = session.prepare(req)
    assert hb.plan.prefix_len > 0  # the sharing rule splits it: the forked path runs
    with torch.inference_mode():
        together = scores_of(session.predict([req]))
        alone = torch.cat([scores_of(session.predict([Request(f"r{i}", (q,), prefix=req.prefix)]))
                           for i, q in enumerate(qs)])
        with unshared(session):
            plain = scores_of(session.predict([req]))
    assert together.shape == (18,) and torch.isfinite(together).all()
    assert relative_error(together, alone) < 1e-4
    assert relative_error(together, plain) < 1e-4


def test_threads_preparing_at_once_get_the_ids_one_thread_gets(checkpoint):
    """`Session.prepare` runs on the predictor's worker threads: their batch calls into the library
    (each on its threads, the GIL released) give what a lone caller gets."""
    from concurrent.futures import ThreadPoolExecutor

    tok = HFTokenizer(checkpoint / "tokenizer.json", preset("tiny"))
    rng = random.Random(1)
    batches = [[f"Answer: {rng.random()} {'klm nop ' * rng.randint(0, 30)}" for _ in range(rng.randint(1, 60))]
               for _ in range(48)]
    alone = [[tok.encode(t) for t in texts] for texts in batches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(tok.encode_many, batches))
    assert together == alone
