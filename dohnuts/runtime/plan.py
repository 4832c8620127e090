"""Request → token plan: the sequences, the scored positions, and the shared-prefix split.

Each question becomes one causal sequence:

    [vision_start, image × n, vision_end]   if the request has an image
    prefix tokens, "\n"                      if the request has a prefix
    "Question: " + text + "\n"
    for each candidate: "Answer: " + candidate, SCORE

The scalar head reads the hidden state at each SCORE token. Because the image and the prefix
come first, all questions of a request share a causal prefix; `shared_prefix_split` decides
whether to compute it once (the sharing rule of dohnuts.runtime.policy).
"""

from __future__ import annotations

from dataclasses import dataclass

from dohnuts.errors import RequestError
from dohnuts.runtime.requests import Request

# The sharing rule (dohnuts.runtime.policy): the split lands on a multiple of 64 tokens, the delta
# rule's chunk, as the specification states; and a request shares only when computing its prefix
# once saves at least MIN_SAVED_TOKENS tokens of dense work, (B − 1) · P. A shared pass costs the
# prefix's token mixers on top of the suffixes' (about 24 latency-bound kernels a layer, whatever P):
# below that saving one batched pass is as fast (measured by `benchmarks/sharing_rule.py` at commit d37d1f2:
# docs/history/evolution.md M22).
PREFIX_ALIGN = 64
MIN_SAVED_TOKENS = 256


@dataclass(frozen=True)
class RequestPlan:
    request: Request
    sequences: tuple[tuple[int, ...], ...]  # token ids per question
    score_positions: tuple[tuple[int, ...], ...]  # per question, index of each candidate's SCORE token
    image_tokens: int = 0  # placeholder tokens at positions 1..image_tokens (after vision_start)
    image_grid: tuple[int, int, int] | None = None  # (t, h, w) patch grid of the image
    prefix_len: int = 0  # tokens computed once and forked (0 = single batched pass)
    common_prefix_len: int | None = None  # tokens all sequences share (None: not computed yet)

    def common_prefix(self) -> int:
        """The longest common prefix of the sequences (the planner's, or computed here)."""
        return longest_common_prefix(self.sequences) if self.common_prefix_len is None else self.common_prefix_len

    @property
    def lengths(self) -> list[int]:
        return [len(s) for s in self.sequences]


def longest_common_prefix(seqs: tuple[tuple[int, ...], ...], known: int = 0) -> int:
    """The number of leading tokens every sequence shares, given that they share at least the
    first `known` (the planner knows its request head is in every sequence, so only the rest is
    compared). Slices are compared in C and the first mismatch with each sequence is found by
    bisection: O(N · L log L) element compares at C speed instead of an O(N · L) Python loop
    (2.3 ms of a 32 × 512-token request's preparation)."""
    first = tuple(seqs[0])
    p = min(len(s) for s in seqs)
    known = min(known, p)
    for s in seqs[1:]:
        s = tuple(s)
        if s[known:p] == first[known:p]:
            continue
        lo, hi = known, p - 1  # first[:lo] == s[:lo], and they differ within [:hi + 1]
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if s[:mid] == first[:mid]:
                lo = mid
            else:
                hi = mid - 1
        p = lo
    return p


def shared_prefix_split(plan_seqs, score_positions, *, common: int | None = None) -> int:
    """The sharing rule: the split point P, or 0 for one batched pass.

    P is the longest common prefix (`common`, computed if None), capped at every first candidate
    position (all scored positions stay in the suffix, and every suffix is non-empty), aligned
    down to PREFIX_ALIGN. The request shares when it has two questions or more and computing P
    once saves at least MIN_SAVED_TOKENS tokens, (B − 1) · P. A pure function of the token plan:
    the same request takes the same path in every process, on every device."""
    if len(plan_seqs) < 2:
        return 0
    p = longest_common_prefix(plan_seqs) if common is None else common
    p = min(p, min(pos[0] for pos in score_positions))
    p -= p % PREFIX_ALIGN
    return p if p > 0 and (len(plan_seqs) - 1) * p >= MIN_SAVED_TOKENS else 0


def plan_request(req: Request, tokenizer, *, max_len: int, image_tokens: int = 0,
                 image_grid: tuple[int, int, int] | None = None, share_prefix: bool = True,
                 source: str | None = None) -> RequestPlan:
    """One request's token plan. `share_prefix=False` never splits: the measurement-only unshared
    variant (dohnuts.runtime.policy.UNSHARED) and the transformers peer's plain batches."""
    sp = tokenizer.special
    head: list[int] = []
    if image_tokens:
        head = [sp.vision_start] + [sp.image] * image_tokens + [sp.vision_end]
    # Every string of the request tokenized in one call (a checkpoint's tokenizer runs them on its own
    # threads: `HFTokenizer.encode_many`), each on its own as before: the prefix, then per question
    # its text and its candidates, in order.
    texts = [req.prefix + "\n"] if req.prefix else []
    for q in req.questions:
        texts.append(f"Question: {q.text}\n")
        texts += [f"Answer: {cand}" for cand in q.candidates]
    encoded = tokenizer.encode_many(texts)
    k = 0  # the next text's index in `encoded`
    if req.prefix:
        head += encoded[0]
        k = 1
    # Each sequence is the shared head then the question's own tokens, joined once as tuples: the
    # head is not copied into every question's list first (docs/history/evolution.md M49).
    head_t, h = tuple(head), len(head)
    seqs, positions = [], []
    score = sp.score
    for qi, q in enumerate(req.questions):
        body = encoded[k]  # a new list (both tokenizers): extended in place below
        k += 1
        if h + len(body) >= max_len:  # no room left for a candidate: blame what filled the context
            if h < max_len:
                what, field = "question", f"questions[{qi}].text"
            elif image_tokens and image_tokens + 2 >= max_len:
                what, field = "image", "image"
            else:
                what, field = "prefix", "prefix"
            raise RequestError(
                f"the {what} brings the sequence to {h + len(body)} tokens before any candidate, over the context "
                f"of {max_len}", source=source or req.id, field=field,
            )
        pos = []
        for ci in range(len(q.candidates)):
            body += encoded[k]
            k += 1
            body.append(score)
            pos.append(h + len(body) - 1)
            if h + len(body) > max_len:
                raise RequestError(
                    f"candidate {ci} brings the sequence to {h + len(body)} tokens, over the context of {max_len}",
                    source=source or req.id, field=f"questions[{qi}].candidates[{ci}]",
                )
        seqs.append(head_t + tuple(body))
        positions.append(tuple(pos))
    seqs_t, pos_t = tuple(seqs), tuple(positions)
    # Once (the split and the work records both need it); every sequence starts with `head`.
    common = longest_common_prefix(seqs_t, known=h)
    prefix = shared_prefix_split(seqs_t, pos_t, common=common) if share_prefix else 0
    return RequestPlan(req, seqs_t, pos_t, image_tokens, image_grid, prefix, common)
