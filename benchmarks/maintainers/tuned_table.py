"""Make the tuned-configuration table (dohnuts/ops/_tuned.py) from a Triton cache on a GPU.

Run on the GPU the table is for, after a run that started from an EMPTY Triton cache and used
every kernel at every shape worth keeping (the standard suite and the GPU tests), so that every
autotune file in the cache comes from the kernels' current sources:

    TRITON_CACHE_DIR=.triton_cache python3 benchmarks/maintainers/tuned_table.py .triton_cache \
        dohnuts/ops/tuned/h200.json

Each `<kernel>.autotune.json` becomes an entry (its cache directory's hex key, file name and
content) with the kernel's module, name and source digest; a file whose kernel is not found among
dohnuts' and fla's kernels is left out and listed.
"""

from __future__ import annotations

import argparse
import base64
import importlib
import json
import pkgutil
import sys
from datetime import datetime, timezone
from pathlib import Path


def _hex_key(directory: str) -> str:
    return base64.b32decode(directory + "=" * (-len(directory) % 8)).hex()


def kernels() -> dict[str, tuple[str, str, object]]:
    """fn name → (module, attribute, kernel) for every Triton autotuner in dohnuts.ops and fla."""
    import triton

    import dohnuts.ops as dops
    import fla

    names = {}
    for package in (dops, fla):
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            try:
                module = importlib.import_module(info.name)
            except Exception:  # an optional fla module whose dependencies are absent
                continue
            for attr, obj in vars(module).items():
                # an autotuner may sit under other wrappers (fla's `@triton.heuristics` outermost)
                fn, tuned = obj, False
                for _ in range(8):
                    tuned |= isinstance(fn, triton.runtime.Autotuner)
                    if not isinstance(fn, triton.runtime.KernelInterface) or not hasattr(fn, "fn"):
                        break
                    fn = fn.fn
                if tuned:
                    names.setdefault(fn.__name__[:150], (info.name, attr, obj))
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cache", type=Path, help="the Triton cache directory (TRITON_CACHE_DIR)")
    parser.add_argument("out", type=Path, help="the table to write (dohnuts/ops/tuned/<gpu>.json)")
    args = parser.parse_args(argv)

    import fla
    import torch
    import triton

    from dohnuts.ops._tuned import fingerprint, source_digest

    known = kernels()
    entries, unknown = [], []
    for path in sorted(args.cache.glob("*/*.autotune.json")):
        name = path.name[: -len(".autotune.json")]
        if name not in known:
            unknown.append(name)
            continue
        module, attr, kernel = known[name]
        entries.append({"key": _hex_key(path.parent.name), "file": path.name, "module": module, "kernel": attr,
                        "source_sha256": source_digest(kernel), "content": path.read_text()})
    table = {
        "gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "fla": fla.__version__,
        "torch": torch.__version__, "made": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": fingerprint(), "entries": entries,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{args.out}: {len(entries)} tuned entries for {table['gpu']}, Triton {table['triton']}"
          + (f"; left out (kernel not found): {', '.join(sorted(set(unknown)))}" if unknown else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
