"""dohnuts: a Qwen3.5-style vision-language scoring runtime.

    import dohnuts
    model = dohnuts.load("qwen3.5-2b")          # or a HF Qwen3.5 checkpoint directory
    results = model.predict(requests)

Importing the package does no work (torch is imported on first use of `load`).
"""

from __future__ import annotations

__version__ = "0.1.0"
__all__ = ["load"]


def load(source="tiny", **kwargs):
    """A runtime session (dohnuts.runtime.session.Session) — see dohnuts.api.load for the arguments."""
    # `import dohnuts` does no work: the runtime (and torch) load on first use
    from dohnuts.api import load as _load

    return _load(source, **kwargs)
