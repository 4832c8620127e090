"""Prediction: requests → scores, calibrated probabilities and choices, as a pipeline.

    prepare (CPU worker threads: tokenize, plan, image decode, collate, pin)
      → h2d (transfer stream, non-blocking, one batch ahead)
      → score (compute stream: vision via the cache, prefix/suffix or one pass, head)
      → decide + d2h (non-blocking into pinned memory)
      → serialize (host, while the device runs the next request)

CUDA events order the streams and keep each host buffer alive until its copy has completed.
On the CPU the same code runs without streams. Every request is one model invocation.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch

from dohnuts.errors import DohnutsError, RequestError
from dohnuts.model.scorer import decide
from dohnuts.runtime.batch import HostBatch, collate, without_patches
from dohnuts.runtime.plan import plan_request
from dohnuts.runtime.requests import Request
from dohnuts.runtime.timing import NULL_TIMER


@dataclass(frozen=True)
class QuestionResult:
    id: str
    scores: list[float]
    probabilities: list[float]
    choice: int


@dataclass(frozen=True)
class RequestResult:
    id: str
    questions: list[QuestionResult]

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "questions": [q.__dict__ for q in self.questions]})


@dataclass(frozen=True)
class RequestFailure:
    id: str
    error: str
    line: int | None = None

    def to_json(self) -> str:
        d = {"id": self.id, "error": self.error}
        if self.line is not None:
            d["line"] = self.line
        return json.dumps(d)


class Predictor:
    """Runs requests through one model with prefetching and asynchronous transfers."""

    def __init__(self, model, *, share_prefix: bool = True, workers: int = 2, train: bool = False):
        self.model = model
        self.share_prefix = share_prefix
        self.train = train
        self.device = model.device
        self.cuda = self.device.type == "cuda"
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dohnuts-prepare")
        self._copy_stream = torch.cuda.Stream(self.device) if self.cuda else None

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    # -- stages -------------------------------------------------------------------------------

    def prepare(self, req: Request, source: str | None = None) -> HostBatch:
        """CPU work for one request: image decode, tokens, plan, tensors (pinned on CUDA)."""
        image, positions, n_img, grid = None, None, 0, None
        if req.image is not None:
            image, positions, n_img, grid = self.model.prepare_image(req, source=source)
        plan = plan_request(req, self.model.tokenizer, max_len=self.model.max_len, image_tokens=n_img,
                            image_grid=grid, share_prefix=self.share_prefix, source=source)
        if positions is not None:
            positions = self.model.sequence_positions(plan)
        hb = collate(plan, pad_id=self.model.tokenizer.special.pad, image=image, train=self.train,
                     positions=positions)
        if image is not None and image.key in self.model.image_cache:
            hb = without_patches(hb)  # cached features: no pixels to move (re-read from host if evicted)
        if self.cuda:
            hb = HostBatch(hb.plan, hb.tensors.pin(), hb.work, hb.image)
        return hb

    def transfer(self, hb: HostBatch):
        """Issue the host→device copy; returns (device batch, event the compute stream must wait on)."""
        if not self.cuda:
            return hb.tensors, None
        with torch.cuda.stream(self._copy_stream):
            dev = hb.tensors.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return dev, ready

    def device_batch(self, hb: HostBatch):
        """Copy a prepared batch to the device and make the compute stream wait for it."""
        dev, ready = self.transfer(hb)
        self._await(dev, ready)
        return dev

    def _await(self, dev, ready) -> None:
        """Make the compute stream wait for a copy, and keep the copied buffers alive for it."""
        if ready is None:
            return
        stream = torch.cuda.current_stream(self.device)
        stream.wait_event(ready)
        for t in vars(dev).values():
            if isinstance(t, torch.Tensor):
                t.record_stream(stream)  # the copy stream allocated it; the compute stream uses it

    def compute(self, hb: HostBatch, dev, ready, timer=NULL_TIMER):
        """Score on the compute stream; returns (host probs, host choices, host scores, done event)."""
        self._await(dev, ready)
        with torch.inference_mode():
            feats = self.model.image_features_for(hb, dev, timer) if hb.image is not None else None
            scores = self.model.score(dev, image_features=feats, timer=timer)
            with timer.stage("d2h"):
                probs, choice = decide(scores, dev.cand_matrix, self.model.temperature)
                out = [probs, choice, scores]
                if self.cuda:
                    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in out]
                    for h, t in zip(host, out):
                        h.copy_(t, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record()
                    return host, done
                return out, None

    @staticmethod
    def serialize(hb: HostBatch, host, done) -> RequestResult:
        if done is not None:
            done.synchronize()
        probs, choice, scores = (t.tolist() for t in host)
        cand = hb.tensors.cand_matrix.tolist()
        results = []
        for qi, q in enumerate(hb.plan.request.questions):
            k = len(q.candidates)
            results.append(QuestionResult(
                id=q.id, scores=[scores[cand[qi][j]] for j in range(k)], probabilities=probs[qi][:k],
                choice=int(choice[qi]),
            ))
        return RequestResult(hb.plan.request.id, results)

    # -- whole calls --------------------------------------------------------------------------

    def call(self, req: Request, timer=NULL_TIMER, source: str | None = None) -> tuple[RequestResult, HostBatch]:
        """One request end to end, without overlap (the harness times each stage of it)."""
        with timer.stage("prepare"):
            hb = self.prepare(req, source)
        with timer.stage("h2d"):
            dev, ready = self.transfer(hb)
        host, done = self.compute(hb, dev, ready, timer)
        with timer.stage("serialize"):
            result = self.serialize(hb, host, done)
            result.to_json()
        return result, hb

    def run(self, items: Iterable[tuple[str, Request | DohnutsError]],
            timer_for: Callable[[int], object] | None = None) -> Iterator[RequestResult | RequestFailure]:
        """Pipelined prediction over (source, request-or-error) items, results in input order.

        While the device scores request i, a worker prepares i+1 and i+2, the copy stream moves
        i+1, and the host serializes i−1. A request that fails validation or preparation yields a
        `RequestFailure` in its place; the others are still scored.
        """
        items = iter(items)
        pending = []  # futures of prepared batches, in order

        def submit_next() -> None:
            nxt = next(items, None)
            if nxt is None:
                return
            source, req = nxt
            if isinstance(req, DohnutsError):
                pending.append((source, req, None))
            else:
                pending.append((source, req, self._pool.submit(self.prepare, req, source)))

        for _ in range(3):
            submit_next()
        previous = None  # (hb, host, done) awaiting serialization
        index = 0
        while pending:
            source, req, fut = pending.pop(0)
            submit_next()
            try:
                if fut is None:
                    raise req
                hb = fut.result()
                dev, ready = self.transfer(hb)
                timer = timer_for(index) if timer_for else NULL_TIMER
                host, done = self.compute(hb, dev, ready, timer)
            except DohnutsError as exc:
                if previous is not None:
                    yield self.serialize(*previous)
                    previous = None
                rid = req.id if isinstance(req, Request) else source
                yield RequestFailure(id=str(rid), error=str(exc), line=_line_of(source))
                index += 1
                continue
            if previous is not None:
                yield self.serialize(*previous)  # overlaps the device work just launched
            previous = (hb, host, done)
            index += 1
        if previous is not None:
            yield self.serialize(*previous)


def _line_of(source: str | None) -> int | None:
    if source and ":" in source:
        tail = source.rsplit(":", 1)[1]
        if tail.isdigit():
            return int(tail)
    return None


def predict(model, requests: Iterable[Request], *, share_prefix: bool = True) -> list[RequestResult | RequestFailure]:
    """Score a list of requests (the Python API behind `ScoringModel.predict`)."""
    pred = Predictor(model, share_prefix=share_prefix)
    try:
        return list(pred.run((r.id, r) for r in requests))
    finally:
        pred.close()


__all__ = ["Predictor", "QuestionResult", "RequestFailure", "RequestResult", "RequestError", "predict"]
