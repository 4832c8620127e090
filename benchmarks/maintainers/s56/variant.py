"""Session 56 (scratch): `dohnuts-bench` with the early tower (the branch as it stands) or without it
(`stage`: Session._encode_early answers None, so the vision stage encodes every image, as main
does) — an A/B through the real instrument, nothing switchable left in the product.

    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/maintainers/s56/variant.py {early|stage} run ... 
"""

import sys

from dohnuts.runtime.session import Session

variant, args = sys.argv[1], sys.argv[2:]
if variant == "stage":
    Session._encode_early = lambda self, pending: None
elif variant != "early":
    raise SystemExit(f"variant must be early or stage, not {variant!r}")
from dohnuts.bench.cli import main  # noqa: E402

sys.exit(main(args))
