"""Built-in workload kinds: text, shared-prefix, image, image-cache (cold/warm), train-step, and
requests (a request set as users send it: bench_plugins/workloads/requests.py).

Every kind generates its requests itself (seeded, no downloads), sized in model tokens:

    seq_tokens       tokens of one question's whole sequence (text; image tokens come on top)
    prefix_tokens    shared context before every question of a request (0 = none)
    questions        questions per request (= sequences in the batched pass)
    candidates       candidates per question; candidate_tokens long each
    requests         distinct requests, cycled through warm-up and measured calls

A workload's `serving.vary` asks the text and image kinds for a varied served set as well
(`varied_calls`: one request a size drawn by dohnuts.bench.measure.serving.variety.draw_sizes, the shape's
other fields kept); the single calls keep `shape:`.

With the byte tokenizer of the presets the sizes are exact; with a checkpoint's tokenizer they
are met within a few tokens (the records carry the exact counts).

Upper bounds (so a typo cannot ask for inputs that never finish generating): requests ≤ 1024,
questions ≤ 4096, candidates ≤ 1024, seq_tokens ≤ the model's context (checked when the file is
validated: `sequence_tokens` below against dohnuts.bench.measure.workload.check_context; never above
2¹⁸), and requests × questions × seq_tokens ≤ 2²⁶ generated tokens (about half a minute of
text generation). Image kinds: distinct_images ≤ 1024, at most 1024 resolutions, each image
≤ 8192² pixels and the image pool ≤ 2³⁰ pixels in all.
"""

from __future__ import annotations

import string
from typing import Annotated, Any, Literal

import msgspec
import numpy as np
from msgspec import Meta
from PIL import Image

from dohnuts.bench.calls import PredictCall, TrainCall
from dohnuts.bench.hookspecs import hookimpl
from dohnuts.bench.measure.serving.variety import draw_sizes
from dohnuts.errors import ConfigError
from dohnuts.runtime.requests import Question, Request
from dohnuts.schema import Invalid
from dohnuts_bench_plugins.workloads.requests import RequestsKind

MAX_SEQ_TOKENS = 2**18  # above any context the runtime accepts; the model's context is checked too
MAX_GENERATED_TOKENS = 2**26  # requests × questions × seq_tokens: the text a workload generates


class TextShape(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Text requests: sizes in model tokens (module docstring)."""

    requests: Annotated[int, Meta(ge=1, le=1024, description="distinct requests, cycled")] = 4
    questions: Annotated[int, Meta(ge=1, le=4096, description="questions per request")] = 8
    seq_tokens: Annotated[int, Meta(ge=16, le=MAX_SEQ_TOKENS,
                                    description="tokens per question sequence (at most the model's context)")] = 256
    prefix_tokens: Annotated[int, Meta(ge=0, le=MAX_SEQ_TOKENS,
                                       description="shared context tokens before every question")] = 0
    candidates: Annotated[int, Meta(ge=1, le=1024, description="candidates per question")] = 4
    candidate_tokens: Annotated[int, Meta(ge=1, le=MAX_SEQ_TOKENS, description="tokens per candidate")] = 4

    def __post_init__(self) -> None:
        validate_text(self)


# Byte-tokenizer overhead of the sequence layout (dohnuts.runtime.plan): "\n" after the prefix,
# "Question: " + "\n" around the question, "Answer: " + SCORE around each candidate.
PREFIX_OVERHEAD, QUESTION_OVERHEAD, CANDIDATE_OVERHEAD = 1, 11, 9


def _word(rng, letters: str = string.ascii_lowercase) -> str:
    return "".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))


def filler(tokenizer, n_tokens: int, rng) -> str:
    """Random lowercase words of about `n_tokens` tokens (exactly, for the byte tokenizer): the
    shortest run of seeded words whose encoding reaches `n_tokens`, cut to `n_tokens` characters
    for the byte tokenizer.

    Linear in `n_tokens`: words are drawn in batches that grow geometrically and the text is
    encoded once per batch, not once per word; the stopping word is then found by bisection and
    `rng` is rewound to just after it, so the text and every later draw are exactly those of
    drawing and encoding word by word (the quadratic loop this replaces)."""
    if n_tokens <= 0:
        return ""
    words: list[str] = []

    def reaches(k: int) -> bool:
        return len(tokenizer.encode(" ".join(words[:k]))) >= n_tokens

    batch = max(1, n_tokens // 6)  # about 6 characters a word (2..8 letters and a space)
    while True:
        start, state = len(words), rng.getstate()
        words.extend(_word(rng) for _ in range(batch))
        if reaches(len(words)):
            break
        batch = max(1, len(words) // 4, n_tokens // 6 - len(words))
    lo, hi = start + 1, len(words)  # the first k in (start, len] whose text reaches n_tokens
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid + 1
    rng.setstate(state)  # redraw the last batch up to the stopping word: rng ends where it would have
    words[start:] = [_word(rng) for _ in range(lo - start)]
    text = " ".join(words)
    if len(tokenizer.encode(text)) > n_tokens and getattr(tokenizer, "name", "") == "bytes":
        text = text[:n_tokens]
    return text


def question_text_tokens(shape: TextShape) -> int:
    prefix = shape.prefix_tokens + PREFIX_OVERHEAD if shape.prefix_tokens else 0
    per_cand = CANDIDATE_OVERHEAD + shape.candidate_tokens
    return shape.seq_tokens - prefix - QUESTION_OVERHEAD - shape.candidates * per_cand


def validate_text(shape: TextShape) -> None:
    """The sizes together: room for the question text, and a bounded amount of generated text."""
    if question_text_tokens(shape) < 1:
        raise Invalid(
            f"is too small for {shape.prefix_tokens} prefix tokens and {shape.candidates} candidates of "
            f"{shape.candidate_tokens} tokens (needs at least {shape.seq_tokens - question_text_tokens(shape) + 1})",
            field="seq_tokens")
    total = shape.requests * shape.questions * shape.seq_tokens
    if total > MAX_GENERATED_TOKENS:
        raise Invalid(
            f"asks for {shape.requests} requests × {shape.questions} questions × {shape.seq_tokens} tokens "
            f"= {total} tokens of generated text, more than {MAX_GENERATED_TOKENS} (2^26)", field="seq_tokens")


def text_sequence_tokens(shape: TextShape, model_cfg, *, source: str) -> int:
    """The longest sequence of a text workload's calls: `seq_tokens` (prefix, question and
    candidates; exact with the byte tokenizer)."""
    return shape.seq_tokens


class SharedPrefixShape(TextShape, frozen=True, forbid_unknown_fields=True, kw_only=True):
    prefix_tokens: Annotated[int, Meta(ge=1, description="shared context tokens before every question")]


class ImageShape(TextShape, frozen=True, forbid_unknown_fields=True, kw_only=True):
    resolution: Annotated[list[Any], Meta(description="[width, height] or a list of them, cycled over images")] = \
        msgspec.field(default_factory=lambda: [448, 448])
    distinct_images: Annotated[int, Meta(ge=1, le=1024, description="images in the pool")] = 4
    duplicate_ratio: Annotated[float, Meta(ge=0.0, le=1.0, description="share of requests reusing an earlier "
                                                                       "image")] = 0.0

    def __post_init__(self) -> None:
        validate_text(self)
        _pool(self)


class ImageCacheShape(ImageShape, frozen=True, forbid_unknown_fields=True, kw_only=True):
    cache: Annotated[Literal["cold", "warm"], Meta(description="cache state per call")]


class TrainStepShape(TextShape, frozen=True, forbid_unknown_fields=True, kw_only=True):
    requests: Annotated[int, Meta(ge=4, le=1024, description="distinct requests, 4 per update")] = 8


def text_request(ctx, shape: TextShape, request_id: str, *, image: str | None = None,
                 answers: bool = False) -> Request:
    """One request of `shape`'s sizes, its text drawn from `ctx.rng`."""
    rng, tok = ctx.rng, ctx.tokenizer
    q_tokens = question_text_tokens(shape)
    prefix = filler(tok, shape.prefix_tokens, rng)
    qs = []
    for q in range(shape.questions):
        cands = tuple(filler(tok, shape.candidate_tokens, rng) for _ in range(shape.candidates))
        rewards = None
        if answers:
            right = rng.randrange(len(cands))
            rewards = tuple(1.0 if i == right else 0.0 for i in range(len(cands)))
        qs.append(Question(id=f"q{q}", text=filler(tok, q_tokens, rng), candidates=cands, rewards=rewards))
    return Request(id=request_id, questions=tuple(qs), prefix=prefix, image=image)


def text_requests(ctx, *, image_for=None, answers: bool = False) -> list[Request]:
    shape = ctx.spec.shape
    return [text_request(ctx, shape, f"{ctx.spec.name}-{r}", image=image_for(r) if image_for is not None else None,
                         answers=answers) for r in range(shape.requests)]


def varied_requests(ctx, vary, *, resolutions: list[tuple[int, int]] | None = None, image_for=None) -> list[Request]:
    """The served set of `serving.vary` (dohnuts.bench.measure.serving.variety): one request a drawn size,
    the shape's other fields kept; `image_for(r, (width, height))` the image of request r."""
    shape = ctx.spec.shape
    sizes = draw_sizes(vary, seq_tokens=shape.seq_tokens, questions=shape.questions, resolutions=resolutions,
                       seed=ctx.spec.seed)
    out = []
    for r, size in enumerate(sizes):
        one = msgspec.structs.replace(shape, seq_tokens=size.seq_tokens, questions=size.questions, requests=1)
        image = image_for(r, size.resolution) if size.resolution is not None else None
        out.append(text_request(ctx, one, f"{ctx.spec.name}-served-{r}", image=image))
    return out


class TextKind:
    name = "text"
    Shape = TextShape

    def sequence_tokens(self, shape: TextShape, model_cfg, *, source: str) -> int:
        return text_sequence_tokens(shape, model_cfg, source=source)

    def calls(self, ctx) -> list:
        return [PredictCall(r) for r in text_requests(ctx)]

    def varied_calls(self, ctx, vary) -> list:
        return [PredictCall(r) for r in varied_requests(ctx, vary)]


class SharedPrefixKind(TextKind):
    """Text requests whose questions share a long context (prefix_tokens > 0 required)."""

    name = "shared-prefix"
    Shape = SharedPrefixShape


MAX_IMAGE_POOL_PIXELS = 2**30
MAX_RESOLUTIONS = 1024


def _resolutions(shape: ImageShape) -> list[tuple[int, int]]:
    res = shape.resolution
    pairs = res if res and isinstance(res[0], list) else [res]
    if len(pairs) > MAX_RESOLUTIONS:
        raise Invalid(f"lists {len(pairs)} resolutions, more than {MAX_RESOLUTIONS}", field="resolution")
    out = []
    for i, p in enumerate(pairs):
        if (not isinstance(p, list) or len(p) != 2 or not all(isinstance(x, int) and not isinstance(x, bool)
                                                               for x in p) or min(p) <= 0):
            raise Invalid(f"entry {i} must be [width, height] in positive pixels, got {p!r}", field="resolution")
        if p[0] * p[1] > 8192 * 8192:
            raise Invalid(f"entry {i} has {p[0] * p[1]} pixels, over the decoder limit of 8192²", field="resolution")
        out.append((p[0], p[1]))
    return out


def _pool(shape: ImageShape) -> list[tuple[int, int]]:
    """(width, height) of every image of the pool (the resolutions cycled), within the pixel budget."""
    res = _resolutions(shape)
    pool = [res[i % len(res)] for i in range(shape.distinct_images)]
    pixels = sum(w * h for w, h in pool)
    if pixels > MAX_IMAGE_POOL_PIXELS:
        raise Invalid(f"makes an image pool of {pixels} pixels ({shape.distinct_images} images), more than "
                      f"{MAX_IMAGE_POOL_PIXELS} (2^30)", field="distinct_images")
    return pool


def image_tokens(width: int, height: int, vision) -> int:
    """Text positions one generated image takes (dohnuts.runtime.images.prepare_image's arithmetic)."""
    # torch: not while the plugins are collected (before the command's checks); loaded where it runs
    from dohnuts.runtime.images import smart_resize

    th, tw = smart_resize(height, width, vision.patch_size * vision.spatial_merge_size)
    m = vision.spatial_merge_size
    return (th // vision.patch_size) * (tw // vision.patch_size) // (m * m)


def _write_image(path, size: tuple[int, int], gen) -> str:
    """A generated PNG of `size` (width, height): a smooth random colour field, not noise — it
    compresses like a photo, so decode time is realistic."""
    w, h = size
    small = gen.integers(0, 256, (max(1, h // 32), max(1, w // 32), 3), dtype=np.uint8)
    Image.fromarray(small).resize((w, h), Image.BILINEAR).save(path)
    return str(path)


class ImageKind:
    name = "image"
    Shape = ImageShape

    def sequence_tokens(self, shape: ImageShape, model_cfg, *, source: str) -> int:
        """seq_tokens plus the largest image's tokens and its two vision markers."""
        if model_cfg.vision is None:
            raise ConfigError(f"model {model_cfg.name!r} has no vision tower, which {self.name} workloads need",
                              source=source, field="model")
        most = 0
        for w, h in dict.fromkeys(_pool(shape)):
            try:
                most = max(most, image_tokens(w, h, model_cfg.vision))
            except ValueError as exc:  # e.g. an aspect ratio the preprocessing refuses
                raise ConfigError(f"{w}x{h} cannot be preprocessed ({exc})", source=source,
                                  field="shape.resolution") from None
        return shape.seq_tokens + most + 2

    def _images(self, ctx) -> list[str]:
        shape = ctx.spec.shape
        res = _resolutions(shape)
        gen = np.random.default_rng(ctx.spec.seed)
        return [_write_image(ctx.workdir / f"image{i}.png", res[i % len(res)], gen)
                for i in range(shape.distinct_images)]

    def _assignment(self, ctx, n_images: int) -> list[int]:
        """Image index per request: new images in order, or (duplicate_ratio) an earlier one."""
        shape, rng = ctx.spec.shape, ctx.rng
        out, nxt = [], 0
        for r in range(shape.requests):
            if out and (rng.random() < shape.duplicate_ratio or nxt >= n_images):
                out.append(rng.choice(out))
            else:
                out.append(nxt)
                nxt += 1
        return out

    def calls(self, ctx) -> list:
        paths = self._images(ctx)
        which = self._assignment(ctx, len(paths))
        return [PredictCall(r) for r in text_requests(ctx, image_for=lambda r: paths[which[r]])]

    def varied_calls(self, ctx, vary) -> list:
        """The served set: each request with an image has its own (the feature cache hits when the
        set comes round again, as long as it holds them)."""
        gen = np.random.default_rng((ctx.spec.seed, 3))  # apart from the pool's images
        return [PredictCall(r) for r in varied_requests(
            ctx, vary, resolutions=_resolutions(ctx.spec.shape),
            image_for=lambda r, size: _write_image(ctx.workdir / f"served-image{r}.png", size, gen))]


class ImageCacheKind(ImageKind):
    """Image requests under a controlled cache state: `cold` makes the session forget every image
    before every call (its feature cache and file memo emptied: every image is read, hashed,
    decoded and encoded, as a new image is), `warm` keeps them (the warm-up calls fill them)."""

    name = "image-cache"
    Shape = ImageCacheShape

    def warmup_every_call(self, spec) -> bool:
        """Warm: every distinct call is warmed once, so measured calls only ever hit."""
        return spec.shape.cache == "warm"

    def calls(self, ctx) -> list:
        cold = ctx.spec.shape.cache == "cold"
        return [PredictCall(c.request, cold_cache=cold) for c in super().calls(ctx)]

    def varied_calls(self, ctx, vary) -> list:
        cold = ctx.spec.shape.cache == "cold"
        return [PredictCall(c.request, cold_cache=cold) for c in super().varied_calls(ctx, vary)]


class TrainStepKind:
    """One optimizer update per call: 4 microbatches (one request each) of labelled questions."""

    name = "train-step"
    collective = True  # under several processes the ranks share each update (runtime.collectives)
    Shape = TrainStepShape

    def sequence_tokens(self, shape: TextShape, model_cfg, *, source: str) -> int:
        return text_sequence_tokens(shape, model_cfg, source=source)

    def calls(self, ctx) -> list:
        reqs = text_requests(ctx, answers=True)
        return [TrainCall(tuple(reqs[(4 * i + j) % len(reqs)] for j in range(4))) for i in range(max(1, len(reqs) // 4))]


@hookimpl
def dohnuts_bench_register_workload_kinds():
    kinds = (TextKind(), SharedPrefixKind(), ImageKind(), ImageCacheKind(), TrainStepKind(), RequestsKind())
    return {k.name: k for k in kinds}
