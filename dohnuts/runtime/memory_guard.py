"""The per-request memory guard of prediction: one request too large for the machine costs its own
line, never the run.

A request is one batched pass, so its activation memory grows with its tokens — a line of thousands
of long questions once asked the CPU for gigabytes in one pass and ended `dohnuts predict` in a
traceback, the good lines before and after it lost. Two guards, both turning the request into a
RequestError for its line (an error record; the other lines are still scored):

1. Before its pass, the pass's memory is estimated from its computed tokens and the model's widths
   (`activation_bytes`) and compared with what the device has free (`free_bytes`: on a CPU the
   available memory, and the room left under an address-space limit; on a GPU the device's free
   memory plus what torch's cache holds unused). Cheap: nothing is asked of the system for a pass
   under `CHECK_FROM_BYTES`.
2. An allocation that fails anyway (the estimate is an estimate) is caught by the predictor
   (`is_out_of_memory`) and costs that request only.

The estimate, per computed token: `PER_TOKEN_TENSORS` live tensors of the model's widest
projection (hidden, MLP, the delta rule's conv channels, attention) at the compute precision; on
the plain-torch reference path (a CPU) also the delta rule's per-token states (heads × dk × dv,
`REFERENCE_STATES` of them), which the fused kernels keep on chip; a shared prefix forked into every
row (its keys and values in each attention layer, its states in each delta-rule layer); and the
attention scores of the batched pass (rows × heads × L × (P + L)). Measured on the CPU with the tiny preset (2,000 questions of 68
tokens): 15.6 KiB a token at the peak; the estimate says 24 KiB (conservative by about 1.5×).
"""

from __future__ import annotations

import resource

import psutil
import torch

from dohnuts.errors import RequestError
from dohnuts.runtime.work import WorkCounts
from dohnuts.schema import size_words

PER_TOKEN_TENSORS = 16      # live activations of the widest width per token at the peak of a pass
REFERENCE_STATES = 4        # delta-rule state matrices per token the reference path holds at once
CHECK_FROM_BYTES = 256 << 20  # a pass estimated below this is not checked (no system call on the hot path)
HEADROOM = 0.9              # of the free memory a pass may take


def activation_bytes(cfg, work: WorkCounts, *, element_bytes: int, reference: bool) -> int:
    """The estimated peak activation memory of the pass `work` describes (module docstring)."""
    t = cfg.text
    conv = 2 * t.linear_num_key_heads * t.linear_key_head_dim + t.linear_num_value_heads * t.linear_value_head_dim
    width = max(t.hidden_size, t.intermediate_size, conv, t.num_attention_heads * t.head_dim)
    per_token = PER_TOKEN_TENSORS * width
    if reference:
        per_token += REFERENCE_STATES * t.linear_num_value_heads * t.linear_key_head_dim * t.linear_value_head_dim
    rows = work.sequences + work.padded_rows
    # a shared prefix is computed once but forked into every row: its keys and values per attention
    # layer, its delta-rule states per linear layer, and the scores of each row's queries over it
    attention = sum(kind == "full_attention" for kind in t.layer_types)
    linear = len(t.layer_types) - attention
    forked = rows * (work.prefix_len * attention * 2 * t.num_key_value_heads * t.head_dim
                     + linear * (t.linear_num_value_heads * t.linear_key_head_dim * t.linear_value_head_dim + conv * 4))
    scores = rows * t.num_attention_heads * work.padded_len * (work.prefix_len + work.padded_len)
    return element_bytes * (work.computed_tokens * per_token + forked + scores)


def free_bytes(device: torch.device) -> int:
    """Memory a pass on `device` may still take: on a GPU the free device memory plus torch's unused
    cache; on a CPU the available memory, and no more than the room under RLIMIT_AS when one is set."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)

    free = psutil.virtual_memory().available
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY:
        free = min(free, soft - psutil.Process().memory_info().vms)
    return max(0, free)


def check_request_memory(session, work: WorkCounts, source: str | None = None) -> None:
    """Refuse (RequestError, for this request's line) a pass estimated larger than the memory the
    device has free."""
    device = session.device
    need = activation_bytes(session.cfg, work, element_bytes=session.model.compute_dtype.itemsize,
                            reference=device.type != "cuda")
    if need < CHECK_FROM_BYTES:
        return
    free = free_bytes(device)
    if need > HEADROOM * free:
        raise RequestError(f"needs about {size_words(need)} of memory for its one pass ({work.sequences} questions, "
                           f"{work.computed_tokens} tokens), more than the {size_words(free)} free on {device.type}; "
                           "split it into several requests", source=source)


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` is an allocation that failed (torch's out-of-memory error on a GPU, the CPU
    allocator's RuntimeError, Python's MemoryError)."""
    if isinstance(exc, (MemoryError, torch.OutOfMemoryError)):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text.lower())
