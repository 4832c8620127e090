"""The host's work on a new image's bytes, timed on this machine (any host: no GPU needed): reading
the file, its digest for the file memo (`ImageKeyMemo`: sha256 since M45, blake2b before), the
inflate of its zlib stream (libdeflate, as the device path does), the memo's digest beside the
inflate on a second thread, and the content key's sha256 over the pixels whole or over 256-KB
chunks on threads (one Merkle level). A PNG made as the image workloads make theirs (448², a
smooth colour field: `_write_image`). Medians of N timings (default 300) of each, in ms.

    PYTHONPATH=. python benchmarks/maintainers/image_hashes.py [OUT.json] [--n 300]

The runtime keeps one choice of each (docs/history/evolution.md M45 has the comparison).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import imagecodecs
import numpy as np

from dohnuts.bench.plugins import import_checkout_packages
from dohnuts.config import preset
from dohnuts.runtime.images import _png_image_data, content_key

import_checkout_packages()  # bench_plugins/ as `dohnuts_bench_plugins` where dohnuts is not installed (the device)
from dohnuts_bench_plugins.workloads import _write_image

CHUNK = 1 << 18
VISION = preset("qwen3.5-2b").vision


def median_ms(fn, n: int) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(statistics.median(times) * 1e3, 4)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", help="write the times here as JSON too")
    p.add_argument("--n", type=int, default=300)
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(_write_image(Path(tmp) / "a.png", (448, 448), np.random.default_rng(0)))
        data = path.read_bytes()
        pixels = imagecodecs.spng_decode(data)
        stream = _png_image_data(data)
        out = np.empty(448 * (1 + 3 * 448), np.uint8)
        pool = ThreadPoolExecutor(4)
        view = memoryview(np.ascontiguousarray(pixels)).cast("B")
        chunks = [view[i:i + CHUNK] for i in range(0, len(view), CHUNK)]

        def inflate():
            imagecodecs.deflate_decode(stream, out=out)

        def digest_beside_inflate():
            later = pool.submit(lambda: hashlib.sha256(data).digest())
            inflate()
            later.result()

        def key_in_chunks():
            rest = [pool.submit(lambda c: hashlib.sha256(c).digest(), c) for c in chunks[1:]]
            parts = [hashlib.sha256(chunks[0]).digest()] + [f.result() for f in rest]
            return hashlib.sha256(b"".join(parts)).digest()

        times = {
            "read the file": median_ms(path.read_bytes, a.n),
            "memo digest: blake2b of the file": median_ms(
                lambda: hashlib.blake2b(data, digest_size=20).digest(), a.n),
            "memo digest: sha256 of the file": median_ms(lambda: hashlib.sha256(data).digest(), a.n),
            "inflate (libdeflate)": median_ms(inflate, a.n),
            "sha256 of the file, then the inflate": median_ms(
                lambda: (hashlib.sha256(data).digest(), inflate()), a.n),
            "sha256 of the file beside the inflate (2 threads)": median_ms(digest_beside_inflate, a.n),
            "content key: sha256 of the pixels": median_ms(lambda: hashlib.sha256(view).digest(), a.n),
            f"content key: {len(chunks)} chunks of 256 KB on threads": median_ms(key_in_chunks, a.n),
            "content key: the runtime's content_key": median_ms(lambda: content_key(pixels, VISION), a.n),
        }
        pool.shutdown()
    cpuinfo = Path("/proc/cpuinfo")  # Linux: whether the CPU has the SHA extensions sha256 runs on
    facts = {"png_bytes": len(data), "pixel_bytes": int(pixels.nbytes),
             "sha_extensions": "sha_ni" in cpuinfo.read_text() if cpuinfo.exists() else None}
    for k, v in times.items():
        print(f"{k:52s} {v:8.4f} ms")
    print(json.dumps(facts))
    if a.out:
        Path(a.out).write_text(json.dumps({"times_ms": times} | facts, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
