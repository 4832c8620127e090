"""The `requests` workload kind: the calls are a request set as users send it, not generated.

    kind: requests
    shape: {set: digits, split: test, limit: 64}   # or set: a request file (JSONL, the predict format;
                                                   #   relative to the workload file's folder)

`digits` is scikit-learn's handwritten digits task (dohnuts.train.digits, written into the run's
inputs folder at its default seed: the split `python -m dohnuts.train.digits DIR` writes), so a
trained adapter (`{name: dohnuts, options: {adapter: runs/digits/best.safetensors}}`) is measured
on the requests it serves, and with `accuracy: {set: digits}` its accuracy is reported beside its
speed (dohnuts.bench.measure.quality).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from dohnuts.bench.calls import PredictCall
from dohnuts.errors import ConfigError


class RequestsShape(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    set: Annotated[str, Meta(description="digits, or a request file (JSONL) relative to the workload file")]
    split: Annotated[Literal["train", "dev", "calib", "test"], Meta(description="the digits split")] = "test"
    limit: Annotated[int, Meta(ge=0, le=100_000, description="requests taken (0: all)")] = 64


class RequestsKind:
    name = "requests"
    Shape = RequestsShape

    def validate(self, shape: RequestsShape, source: str) -> None:
        if shape.set == "digits":

            if importlib.util.find_spec("sklearn") is None:
                raise ConfigError("the digits set needs scikit-learn (pip install scikit-learn)", source=source,
                                  field="shape.set")
            return
        path = Path(shape.set)
        if not path.is_absolute():
            path = Path(source).parent / path
        if not path.is_file():
            raise ConfigError(f"is neither `digits` nor a request file ({path} does not exist)", source=source,
                              field="shape.set")

    def calls(self, ctx) -> list:
        # torch: not while the plugins are collected (before the command's checks); loaded where it runs
        from dohnuts.bench.measure.quality import request_set

        shape = ctx.spec.shape
        _, requests = request_set(shape.set, shape.split, shape.limit, ctx.workdir, labelled=False,
                                  source=ctx.spec.file, field="shape.set")
        return [PredictCall(r) for r in requests]
