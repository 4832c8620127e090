"""A small learnable multiple-choice task the project generates itself (no downloads).

`match`: the question names a short random word; the candidates are that word and distractors
of the same length. Answering needs the SCORE token to compare its candidate with a word many
tokens back, so the model must carry information across the sequence (attention or the delta
rule's memory), not just read local features. Chance accuracy is 1 / candidates.

`shared_prefix` prepends a common context of that many characters to every question of a
request, which makes requests exercise the shared-prefix path.
"""

from __future__ import annotations

import random
import string

from dohnuts.runtime.requests import Question, Request


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_lowercase[:8]) for _ in range(n))


def synthetic_requests(n_requests: int, *, questions: int = 8, candidates: int = 4, word_len: int = 2,
                       shared_prefix: int = 0, seed: int = 0, id_prefix: str = "syn") -> list[Request]:
    rng = random.Random(seed)
    out = []
    for r in range(n_requests):
        prefix = "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(shared_prefix))
        qs = []
        for q in range(questions):
            target = _word(rng, word_len)
            cands = [target]  # a list, not a set: set order follows the per-process string hash seed
            while len(cands) < candidates:
                word = _word(rng, word_len)
                if word not in cands:
                    cands.append(word)
            rng.shuffle(cands)
            qs.append(Question(id=f"q{q}", text=f"find {target}", candidates=tuple(cands),
                               rewards=tuple(1.0 if c == target else 0.0 for c in cands)))
        out.append(Request(id=f"{id_prefix}{r}", questions=tuple(qs), prefix=prefix))
    return out
