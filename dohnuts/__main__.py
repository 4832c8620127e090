"""`python -m dohnuts ...` is the `dohnuts` command (so is `torchrun ... -m dohnuts ...`)."""

import sys

from dohnuts.cli import main

sys.exit(main())
