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

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import msgspec
import torch

from dohnuts.errors import DohnutsError, RequestError
from dohnuts.runtime.batch import HostBatch
from dohnuts.runtime.memory_guard import check_request_memory, is_out_of_memory
from dohnuts.runtime.pipeline import Pipeline
from dohnuts.runtime.requests import Request
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import dumps


class QuestionResult(msgspec.Struct, frozen=True):
    """One question's scores, calibrated probabilities and choice. A msgspec Struct: a call
    builds one a question after the device is done, on a single call's critical path, where a
    frozen dataclass's construction costs several times more (docs/history/evolution.md M63)."""

    id: str
    scores: list[float]
    probabilities: list[float]
    choice: int


class RequestResult(msgspec.Struct, frozen=True):
    id: str
    questions: list[QuestionResult]

    def to_json(self) -> str:
        """One compact JSON line (msgspec's encoder, straight from the Structs: serialising is on a
        single call's critical path); a non-finite score or probability is written as null (strict
        JSON)."""
        return _ENCODER.encode(self).decode()


_ENCODER = msgspec.json.Encoder()


@dataclass(frozen=True)
class RequestFailure:
    id: str
    error: str
    line: int | None = None

    def to_json(self) -> str:
        d = {"id": self.id, "error": self.error}
        if self.line is not None:
            d["line"] = self.line
        return dumps(d)


class Predictor:
    """Runs requests through one session with prefetching and asynchronous transfers."""

    def __init__(self, session, *, workers: int = 2):
        self.session = session
        self.pipeline = Pipeline(session.device, workers=workers)

    def close(self) -> None:
        self.pipeline.close()

    # -- stages -------------------------------------------------------------------------------

    def prepare(self, req: Request, source: str | None = None) -> HostBatch:
        """CPU work for one request (see Session.prepare)."""
        return self.session.prepare(req, source=source)

    def compute(self, hb: HostBatch, dev, ready, timer=NULL_TIMER):
        """Score on the compute stream; returns (host probs, choices, scores; done event; work counts)."""
        self.pipeline.wait(dev, ready)
        with torch.inference_mode():
            scores, work = self.session.score(hb, dev, timer)
            with timer.stage("d2h"):
                out = list(self.session.decide(scores, dev.cand_matrix))  # probs, choice, scores by question
                if not self.pipeline.cuda:
                    return out, None, work
                host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in out]
                for h, t in zip(host, out):
                    h.copy_(t, non_blocking=True)
                done = torch.cuda.Event()
                done.record()
                return host, done, work

    @staticmethod
    def serialize(hb: HostBatch, host, done) -> RequestResult:
        if done is not None:
            done.synchronize()
        probs, choice, scores = (t.tolist() for t in host)  # (Q, Kmax), (Q,), (Q, Kmax): a row a question
        return RequestResult(hb.plan.request.id, [
            QuestionResult(id=q.id, scores=s[:len(q.candidates)], probabilities=p[:len(q.candidates)], choice=c)
            for q, s, p, c in zip(hb.plan.request.questions, scores, probs, choice)])

    def _out_of_memory(self, hb: HostBatch, source: str | None) -> RequestError:
        """A failed allocation as the request's own error (its memory given back first)."""
        if self.pipeline.cuda:
            torch.cuda.empty_cache()
        return RequestError(f"ran out of memory in its one pass ({hb.work.sequences} questions, "
                            f"{hb.work.computed_tokens} tokens); split it into several requests", source=source)

    # -- whole calls --------------------------------------------------------------------------

    def call(self, req: Request, timer=NULL_TIMER, source: str | None = None) -> tuple[RequestResult, WorkCounts]:
        """One request end to end, without overlap (the harness times each stage of it)."""
        with timer.stage("prepare"):
            hb = self.prepare(req, source)
        dev, ready = self.pipeline.transfer(hb, timer)
        host, done, work = self.compute(hb, dev, ready, timer)
        with timer.stage("serialize"):
            result = self.serialize(hb, host, done)
            result.to_json()
        return result, work

    def run(self, items: Iterable[tuple[str, Request | DohnutsError]],
            timer_for: Callable[[int], object] | None = None,
            trace: dict[int, dict] | None = None) -> Iterator[RequestResult | RequestFailure]:
        """Pipelined prediction over (source, request-or-error) items, results in input order.

        While the device scores request i, a worker prepares i+1 and i+2, the copy stream moves
        i+1, and the host serializes i−1. A request that fails validation or preparation, or whose
        pass would not fit in the memory the device has free (dohnuts.runtime.memory_guard: estimated
        before the pass, and an allocation that fails in it), yields a `RequestFailure` in its place;
        the others are still scored.

        `timer_for(i)` times request i's stages; `trace` (a dict) receives per request i the host
        clock (time.perf_counter) when it entered the pipeline (`submitted`), when its device work
        was issued (`started`) and when its result was yielded (`done`), and its work counts.
        """
        items = iter(items)
        pending = []  # futures of prepared batches, in order

        def submit_next() -> None:
            nxt = next(items, None)
            if nxt is None:
                return
            source, req = nxt
            if trace is not None:
                trace[len(trace)] = {"submitted": time.perf_counter()}
            if isinstance(req, DohnutsError):
                pending.append((source, req, None))
            else:
                pending.append((source, req, self.pipeline.submit(self.prepare, req, source)))

        for _ in range(3):
            submit_next()
        previous = None  # (index, hb, host, done) awaiting serialization

        def finish(prev):
            i, hb, host, done = prev
            result = self.serialize(hb, host, done)
            if trace is not None:
                trace[i]["done"] = time.perf_counter()
            return result

        index = 0
        while pending:
            source, req, fut = pending.pop(0)
            submit_next()
            try:
                if fut is None:
                    raise req
                hb = fut.result()
                check_request_memory(self.session, hb.work, source)  # too large for the machine: its line only
                timer = timer_for(index) if timer_for else NULL_TIMER
                if trace is not None:
                    trace[index]["started"] = time.perf_counter()
                try:
                    dev, ready = self.pipeline.transfer(hb, timer)
                    host, done, work = self.compute(hb, dev, ready, timer)
                except (RuntimeError, MemoryError) as exc:  # an allocation the estimate let through
                    if not is_out_of_memory(exc):
                        raise
                    raise self._out_of_memory(hb, source) from None
                if trace is not None:
                    trace[index]["work"] = work
            except DohnutsError as exc:
                if previous is not None:
                    yield finish(previous)
                    previous = None
                rid = req.id if isinstance(req, Request) else source
                if trace is not None:
                    trace[index]["done"] = time.perf_counter()
                yield RequestFailure(id=str(rid), error=str(exc), line=_line_of(source))
                index += 1
                continue
            if previous is not None:
                yield finish(previous)  # overlaps the device work just launched
            previous = (index, hb, host, done)
            index += 1
        if previous is not None:
            yield finish(previous)


def _line_of(source: str | None) -> int | None:
    if source and ":" in source:
        tail = source.rsplit(":", 1)[1]
        if tail.isdigit():
            return int(tail)
    return None


__all__ = ["Predictor", "QuestionResult", "RequestFailure", "RequestResult", "RequestError"]
