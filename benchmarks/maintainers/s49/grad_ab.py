"""Session 49: the adapters' gradients added into .grad by the backward's GEMMs (the tree) against
autograd's additions (`_accumulating` forced False), train-step updates through update_ab.py (two
copies each, rotated rounds, the A/A spread beside).

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s49/grad_ab.py OUT.json [ROUNDS]
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from update_ab import Variant, run  # noqa: E402

from grad_variants import off, on  # noqa: E402

report = run([Variant("autograd adds", enter=off, exit=on), Variant("into .grad")],
             copies=2, rounds=int(sys.argv[2]) if len(sys.argv) > 2 else 5)
print(json.dumps(report["variants"]), json.dumps(report["first"]), flush=True)
if len(sys.argv) > 1:
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
