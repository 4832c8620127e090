"""Session 49: the down projection's input gradient as one GEMM over [dy | du] · [W; a] (the tree's
`tall` path in dohnuts.model.lora) against the two GEMMs it replaces (du · a written, the base GEMM
accumulating onto it: `tall` forced off), train-step updates through update_ab.py (two copies
each, rotated rounds, the A/A spread beside).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/tall_ab.py OUT.json
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_ab import Variant, run  # noqa: E402

from tall_ab_variants import off, on  # noqa: E402

report = run([Variant("two GEMMs", enter=off, exit=on), Variant("tall")],
             copies=2, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 5)
print(json.dumps(report["variants"]), json.dumps(report["first"]), flush=True)
if len(sys.argv) > 1:
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
