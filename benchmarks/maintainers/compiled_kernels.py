"""Record the kernels dohnuts launches into the tuned table's `compiled` list (dohnuts/ops/_precompile.py).

Run on the GPU the table is for: a `dohnuts-bench run` in this process (its arguments after `--`),
with every kernel a dohnuts target compiles recorded as Triton serialises it (the peers' kernels —
transformers', PEFT's — are left out: a peer compiles as its users' processes do). The process must
not have compiled those kernels yet, which a new process never has (the disk cache does not matter:
a launch that finds its kernel on disk still goes through the compile step the recorder watches).

    python3 benchmarks/maintainers/compiled_kernels.py dohnuts/ops/tuned/h200.json $OUT/h200.json \\
        -- run workloads/gpu/*.yaml --out /tmp/runs --quiet

writes the table with `compiled` (and the libdevice path the keys hold) replaced; the run itself
is an ordinary run (`gpu_session.sh` with COMPILED_TABLE=1 does this for its WORKLOADS). The table's
fingerprint must be this machine's: record on the machine the autotune entries were made on.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback
from pathlib import Path

PEER_FILES = ("/transformers/", "/peft/", "transformers_target.py", "peft_target.py")


def launched_by_dohnuts() -> bool:
    """No frame of a peer (transformers, PEFT or their bench targets) on the stack."""
    return not any(part in frame.filename for frame in traceback.extract_stack() for part in PEER_FILES)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("table", type=Path, help="the tuned table this machine's autotune entries are in")
    parser.add_argument("out", type=Path, help="where to write it with the recorded kernels")
    args = parser.parse_args(argv[:split])
    bench_args = argv[split + 1:]

    from dohnuts.bench.cli import main as bench
    from dohnuts.ops._precompile import jit_function, record
    from dohnuts.ops._tuned import fingerprint, source_digest

    table = json.loads(args.table.read_text())
    if table["fingerprint"] != fingerprint():
        print(f"{args.table}: made for another GPU or Triton ({table.get('gpu')}, Triton {table.get('triton')}); "
              "remake its autotune entries here first (tuned_table.py)", file=sys.stderr)
        return 2
    with record(keep=launched_by_dohnuts) as made:
        status = bench(bench_args)
    compiled = []
    for entry in made["compiled"]:
        kernel = jit_function(entry["module"], entry["name"])
        compiled.append(entry | {"source_sha256": source_digest(kernel)})
    table |= {"compiled": compiled,  # in launch order: the threads take the first call's kernels first
              "libdevice": made["libdevice"]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    names = sorted({f"{e['module']}.{e['name']}" for e in compiled})
    print(f"{args.out}: {len(compiled)} recorded kernels ({len(names)} distinct) beside {len(table['entries'])} "
          f"tuned entries; the run's exit status {status}", file=sys.stderr)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
