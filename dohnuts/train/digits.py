"""A real image task for end-to-end training tests: scikit-learn's handwritten digits.

`sklearn.datasets.load_digits` ships 1,797 grayscale 8×8 images of the digits 0–9 (pixel values
0..16) inside the scikit-learn package itself: nothing is downloaded. `write_digits` turns them
into the folder that `dohnuts train --data DIR` reads:

    DIR/images/digit-00000.png ...   one 8×8 8-bit grayscale PNG per sample, value v → (255·v + 8) // 16
    DIR/train.jsonl dev.jsonl calib.jsonl test.jsonl

Each line is one request (README "Requests") with one question over the ten digits:

    {"id": "digit-17", "image": "images/digit-00017.png",
     "questions": [{"id": "q", "text": "Which digit is shown?",
                    "candidates": ["0", "1", ..., "9"], "answer": 7}]}

`image` is relative to the JSONL file's folder, which is how `read_requests` resolves it, so the
folder works from any working directory and can be moved as a whole. Chance accuracy is 1/10.

Splits are stratified by label and fixed by `seed`: each digit's samples are shuffled and cut
into test, calib and dev (10 % each, rounded half up, at least one sample per digit) and train
(the rest, ≈ 70 %), so every split holds every digit in about equal share. Within a file the
requests are in dataset order (the trainer shuffles on its own). `limit` first draws a
stratified subset of that many samples (each digit's quota proportional to its count, largest
remainder; at least 40 so that every split gets every digit) — for fast tests.

`constant_image=True` is the control experiment: the same requests, labels and splits, but every
request points at one image, `images/constant.png` (the mean digit over the whole data set,
rounded), so nothing in the input tells the digits apart and accuracy must stay near chance. A
model that beats chance on the real folder but not on this one is reading the images.

Used by the end-to-end training tests and by hand:

    python -m dohnuts.train.digits OUT_DIR [--seed N] [--limit N] [--constant-image] [--digits 0,1]
    dohnuts train --data OUT_DIR ...
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from PIL import Image

from dohnuts.errors import DohnutsError
from dohnuts.schema import dumps

SPLITS = ("train", "dev", "calib", "test")
HELD_OUT_FRACTION = 0.10  # each of dev, calib, test; train gets the rest
MIN_LIMIT = 40  # 10 digits × 4 splits: the smallest subset in which every split holds every digit
QUESTION = "Which digit is shown?"
CANDIDATES = [str(d) for d in range(10)]
CONSTANT_IMAGE = "constant.png"
SKLEARN_MISSING = "scikit-learn is needed for the digits task (pip install scikit-learn)"


class MissingScikitLearn(ImportError):
    """scikit-learn (which ships the digits) is not installed."""


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """(images uint8 [N, 8, 8] scaled to 0..255, labels int64 [N]) of sklearn's digits."""
    try:
        # scikit-learn: a test tool (the `test` extra), needed for the digits alone
        from sklearn.datasets import load_digits as _load
    except ImportError as exc:
        raise MissingScikitLearn(SKLEARN_MISSING) from exc
    d = _load()
    return scale_pixels(d.images), np.asarray(d.target, dtype=np.int64)


def scale_pixels(values: np.ndarray) -> np.ndarray:
    """0..16 → 0..255 as uint8, rounded half up: (255·v + 8) // 16 (0 → 0, 8 → 128, 16 → 255)."""
    v = np.rint(np.asarray(values, dtype=np.float64)).astype(np.int64)
    return ((255 * v + 8) // 16).astype(np.uint8)


def _round_half_up(x: float) -> int:
    return int(np.floor(x + 0.5))


def _quotas(counts: np.ndarray, limit: int) -> np.ndarray:
    """Per-label subset sizes proportional to `counts`, summing to `limit` (largest remainder)."""
    exact = counts * (limit / counts.sum())
    quota = np.floor(exact).astype(np.int64)
    order = sorted(range(len(counts)), key=lambda i: (-(exact[i] - quota[i]), i))
    for i in order[: limit - int(quota.sum())]:
        quota[i] += 1
    return quota


def split_indices(labels: np.ndarray, *, seed: int = 0, limit: int | None = None) -> dict[str, list[int]]:
    """Dataset indices per split, stratified by label, deterministic in `seed`; each list sorted."""
    rng = np.random.default_rng(seed)
    classes, counts = np.unique(labels, return_counts=True)
    quota = counts if limit is None or limit >= len(labels) else _quotas(counts, limit)
    out: dict[str, list[int]] = {s: [] for s in SPLITS}
    for c, q in zip(classes, quota):
        idx = rng.permutation(np.flatnonzero(labels == c))[: int(q)]
        held = max(1, _round_half_up(len(idx) * HELD_OUT_FRACTION))
        if len(idx) < 3 * held + 1:
            raise DohnutsError(f"digit {c} has only {len(idx)} samples: too few to split", field="limit")
        out["test"] += idx[:held].tolist()
        out["calib"] += idx[held:2 * held].tolist()
        out["dev"] += idx[2 * held:3 * held].tolist()
        out["train"] += idx[3 * held:].tolist()
    return {s: sorted(v) for s, v in out.items()}


def _check_args(seed: int, limit: int | None, n_digits: int = 10) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise DohnutsError(f"must be a non-negative integer, got {seed!r}", field="seed")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, (int, np.integer)):
            raise DohnutsError(f"must be an integer, got {limit!r}", field="limit")
        if limit < 0:
            raise DohnutsError(f"must not be negative, got {limit}", field="limit")
        if limit < 4 * n_digits:
            raise DohnutsError(f"must be at least {4 * n_digits} (4 splits × {n_digits} digits), got {limit}",
                               field="limit")


def _save_png(pixels: np.ndarray, path: Path) -> None:
    # A 2-D uint8 array becomes an 8-bit grayscale ("L") image; the runtime converts it to RGB.
    Image.fromarray(np.ascontiguousarray(pixels, dtype=np.uint8)).save(path, format="PNG")


def write_digits(out_dir: str | Path, *, seed: int = 0, limit: int | None = None,
                 constant_image: bool = False, digits: Sequence[int] | None = None) -> dict:
    """Write images/ and train/dev/calib/test.jsonl under `out_dir`; return a summary.

    The summary: {"out_dir", "seed", "limit", "constant_image", "samples", "images",
    "splits": {"train": n, "dev": n, "calib": n, "test": n}}. Files already there are
    overwritten; other files are left alone. Bad arguments raise `DohnutsError` naming the
    argument (`seed`, `limit`, `out_dir`, `digits`); a missing scikit-learn raises `MissingScikitLearn`.
    `digits` keeps only the samples of those digits (the questions still offer all ten
    candidates): a smaller, faster task for tests.
    """
    chosen = sorted(set(range(10) if digits is None else digits))
    if not chosen or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or not 0 <= d <= 9
                         for d in chosen):
        raise DohnutsError(f"must be digits 0..9, got {digits!r}", field="digits")
    _check_args(seed, limit, len(chosen))
    images, labels = load_digits()
    keep = np.flatnonzero(np.isin(labels, chosen))  # dataset indices of the chosen digits
    sub = split_indices(labels[keep], seed=int(seed), limit=None if limit is None else int(limit))
    splits = {name: sorted(int(keep[j]) for j in idx) for name, idx in sub.items()}
    out = Path(out_dir)
    try:
        img_dir = out / "images"
        img_dir.mkdir(parents=True, exist_ok=True)
        written = 0
        if constant_image:
            mean = np.rint(images.astype(np.float64).mean(axis=0)).astype(np.uint8)
            _save_png(mean, img_dir / CONSTANT_IMAGE)
            written = 1
        for name in SPLITS:
            lines = []
            for i in splits[name]:
                if constant_image:
                    rel = f"images/{CONSTANT_IMAGE}"
                else:
                    rel = f"images/digit-{i:05d}.png"
                    _save_png(images[i], out / rel)
                    written += 1
                req = {"id": f"digit-{i}", "image": rel,
                       "questions": [{"id": "q", "text": QUESTION, "candidates": CANDIDATES,
                                      "answer": int(labels[i])}]}
                lines.append(dumps(req, separators=(",", ":")) + "\n")
            (out / f"{name}.jsonl").write_text("".join(lines), encoding="utf-8")
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DohnutsError(f"cannot write {exc.filename or out}: {reason}", field="out_dir") from exc
    return {
        "out_dir": str(out),
        "seed": int(seed),
        "limit": limit,
        "constant_image": bool(constant_image),
        "digits": chosen,
        "samples": sum(len(v) for v in splits.values()),
        "images": written,
        "splits": {s: len(splits[s]) for s in SPLITS},
    }


class _ArgError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, not usage + message
        raise _ArgError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m dohnuts.train.digits",
                description="Write sklearn's handwritten digits as a `dohnuts train --data` folder.")
    p.add_argument("out_dir", metavar="OUT_DIR", help="folder to write images/ and {train,dev,calib,test}.jsonl")
    p.add_argument("--seed", type=int, default=0, help="split (and subset) seed (default: 0)")
    p.add_argument("--limit", type=int, default=None,
                   help=f"stratified subset of this many samples first (at least {MIN_LIMIT}; default: all 1797)")
    p.add_argument("--constant-image", action="store_true",
                   help="control: every request points at one constant image")
    p.add_argument("--digits", type=_digit_list, default=None,
                   help="keep only these digits, e.g. 0,1 (the questions still offer all ten; default: all)")
    return p


def _digit_list(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be digits separated by commas, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    prog = "dohnuts.train.digits"
    try:
        args = build_parser().parse_args(argv)
        s = write_digits(args.out_dir, seed=args.seed, limit=args.limit, constant_image=args.constant_image,
                         digits=args.digits)
    except _ArgError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except MissingScikitLearn as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except DohnutsError as exc:
        msg = str(exc)
        if exc.field is not None:  # name the command-line argument, not the keyword
            arg = "OUT_DIR" if exc.field == "out_dir" else f"--{exc.field}"
            msg = f"{arg}: {msg.removeprefix(f'field {exc.field!r}: ')}"
        print(f"{prog}: error: {msg}", file=sys.stderr)
        return 2
    sp = s["splits"]
    print(f"digits: {s['samples']} samples (seed {s['seed']}{', constant image' if s['constant_image'] else ''}) "
          f"→ train {sp['train']}, dev {sp['dev']}, calib {sp['calib']}, test {sp['test']}; "
          f"{s['images']} image file(s) in {s['out_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
