"""Test configuration.

transformers (the reference implementation) picks fla's kernels whenever `fla` imports, even
for CPU tensors where they cannot run. Without a GPU, hide fla before anything imports
transformers so its plain-torch paths run. dohnuts itself imports fla only for CUDA tensors.
"""

import sys

import pytest
import torch

if not torch.cuda.is_available():
    sys.modules.setdefault("fla", None)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
