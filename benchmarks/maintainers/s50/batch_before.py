"""Token plan → tensors: a pinned host batch, and its device copy.

CPU workers build `HostBatch`es (pinned memory on CUDA machines, so the copy can be
asynchronous); `HostBatch.to(device)` issues the non-blocking copies on the current stream.
Sequences are right-padded to the longest one; padding never reaches a real token (every op is
causal) and is counted in `WorkCounts`.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, fields, replace

import numpy as np
import torch

from dohnuts.model.inputs import ScoreInputs
from dohnuts.runtime.plan import RequestPlan
from dohnuts.runtime.requests import require_rewards
from dohnuts.runtime.work import WorkCounts


@dataclass(frozen=True)
class Batch:
    """Tensors of one model invocation (host or device side)."""

    ids: torch.Tensor  # (B, L) long: whole sequences, or suffixes after the shared prefix
    score_index: torch.Tensor  # (C,) long: flat indices into the (B·L) rows of the batched pass
    cand_matrix: torch.Tensor  # (Q, Kmax) long: candidate → row of the score vector, −1 = none
    prefix_ids: torch.Tensor | None = None  # (1, P) long: the shared prefix, computed once
    positions: torch.Tensor | None = None  # (3, 1, P + L) long: MRoPE positions (images only)
    rewards: torch.Tensor | None = None  # (Q, Kmax) float32: training targets, 0 where no candidate
    pixel_patches: torch.Tensor | None = None  # (N, C·P·P) uint8: the image's patches (runtime.images)
    image_tokens: int = 0  # image placeholders at absolute positions 1..image_tokens of every sequence
    prefix_next_position: int | None = None  # rotary position after the prefix (host-known: no sync)
    score_rows: torch.Tensor | None = None  # (B, Kmax) long: each row's scored positions (ScoreInputs)
    score_slot: torch.Tensor | None = None  # (C,) long: each candidate's index into the (B·Kmax) grid

    def to(self, device: torch.device, non_blocking: bool = True) -> Batch:
        """The batch on `device`. A packed batch (`pin`) moves its integer tensors in one copy of
        their shared buffer and takes views of it there; every other tensor is copied alone."""
        moved = {}
        packed = self.__dict__.get("_packed")
        if packed is not None:
            buf, layout = packed
            on_device = buf.to(device, non_blocking=non_blocking)
            for name, (offset, shape) in layout.items():
                moved[name] = on_device[offset:offset + shape.numel()].view(shape)
        for f in fields(self):
            if f.name not in moved:
                v = getattr(self, f.name)
                moved[f.name] = v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v
        return Batch(**moved)

    def pin(self) -> Batch:
        """The batch in page-locked memory (so its host→device copies can be asynchronous)."""
        return self.packed(lambda n: torch.empty(n, dtype=torch.long, pin_memory=True),
                           lambda t: t if t.device.type != "cpu" else t.pin_memory())  # patches cut on the GPU stay

    def packed(self, allocate=lambda n: torch.empty(n, dtype=torch.long), keep=lambda t: t) -> Batch:
        """The batch with its integer (long) tensors as views of ONE buffer from `allocate(n)`,
        which `to` moves in one copy; other tensors go through `keep`. Each pinned allocation and
        each copy call costs host time on a single call's critical path: a batch has seven
        integer tensors."""
        out, layout, total = {}, {}, 0
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, torch.Tensor) and v.dtype == torch.long:
                layout[f.name] = (total, v.shape)
                total += v.numel()
            out[f.name] = keep(v) if isinstance(v, torch.Tensor) and v.dtype != torch.long else v
        buf = allocate(total)
        for name, (offset, shape) in layout.items():
            view = buf[offset:offset + shape.numel()].view(shape)
            view.copy_(getattr(self, name))
            out[name] = view
        batch = Batch(**out)
        object.__setattr__(batch, "_packed", (buf, layout))  # not a field: `replace` drops it (per-tensor copies)
        return batch

    def score_inputs(self, image_features: torch.Tensor | None = None) -> ScoreInputs:
        """What the model reads (a device batch plus the request image's cached features)."""
        return ScoreInputs(ids=self.ids, score_index=self.score_index, prefix_ids=self.prefix_ids,
                           positions=self.positions, image_features=image_features, image_tokens=self.image_tokens,
                           prefix_next_position=self.prefix_next_position, score_rows=self.score_rows,
                           score_slot=self.score_slot)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for f in fields(self)
                   if isinstance(v := getattr(self, f.name), torch.Tensor))


@dataclass(frozen=True)
class HostBatch:
    plan: RequestPlan
    tensors: Batch
    work: WorkCounts
    image: object | None = None  # dohnuts.runtime.images.PreparedImage when the request has one

    def pinned(self) -> HostBatch:
        """The same batch in page-locked memory (so the host→device copy can be asynchronous)."""
        return replace(self, tensors=self.tensors.pin())


def collate(plan: RequestPlan, *, pad_id: int, image=None, train: bool = False,
            positions: torch.Tensor | None = None, shape: tuple[int, int] | None = None) -> HostBatch:
    """Build the (unpinned) tensors of one request. `positions` (3, T_max) for image requests.

    `shape` (rows, length) pads the batched pass to a CUDA-graph bucket: whole padding rows below
    the questions and right-padding after them (counted as padded work, never as useful)."""
    P = plan.prefix_len
    seqs = plan.sequences
    lens = [len(s) - P for s in seqs]
    B, L = len(seqs), max(lens)
    if shape is not None:
        if shape[0] < B or shape[1] < L:
            raise ValueError(f"bucket {shape} is smaller than the batch ({B}, {L})")
        B_pass, L = shape
    else:
        B_pass = B
    ids_np = np.full((B_pass, L), pad_id, dtype=np.int64)  # shared with torch below, not copied
    for row, s, n in zip(ids_np, seqs, lens):
        _pack_into(row, s[P:] if P else s, n)
    ids = torch.from_numpy(ids_np)

    # The scored positions as a (B_pass, Kmax) grid, each row padded with its last one (all-padding
    # rows: position 0) — the pass's last layer computes outputs at the grid alone — then each
    # candidate's slot in it, its flat index into the pass's rows, and the candidate table. A few
    # whole-array numpy calls rather than a loop per question or per candidate: 32 questions × 4
    # candidates took 0.088 ms as lists, and 0.022 ms back to back but 0.07 ms after a 20 ms pause
    # as a dozen numpy calls over flat arrays (each call's code and data cold); 0.016 / 0.028 ms so.
    sp = plan.score_positions
    counts = [len(p) for p in sp]
    kmax, C = max(counts), sum(counts)
    local = np.array([p + p[-1:] * (kmax - len(p)) for p in sp], dtype=np.int64) - P  # (B, Kmax)
    slot = np.arange(B * kmax, dtype=np.int64)  # (C,) each candidate's slot in the grid
    if C < B * kmax:  # some question has fewer candidates than Kmax: skip its padding slots
        slot = np.flatnonzero(np.arange(kmax) < np.array(counts)[:, None])
    score_index = (local + np.arange(0, B * L, L)[:, None]).ravel()[slot]  # (C,) row · L + position
    cand = np.full((B, kmax), -1, dtype=np.int64)
    cand.ravel()[slot] = np.arange(C)
    grid = local
    if B_pass > B:
        grid = np.zeros((B_pass, kmax), dtype=np.int64)
        grid[:B] = local
    rewards = None
    if train or all(q.rewards is not None for q in plan.request.questions):
        if train:
            require_rewards(plan.request)
        rewards = torch.tensor([list(q.rewards) + [0.0] * (kmax - len(q.rewards)) for q in plan.request.questions],
                               dtype=torch.float32).view(B, kmax)

    prefix_ids = None
    if P:
        prefix_np = np.empty((1, P), dtype=np.int64)
        _pack_into(prefix_np[0], seqs[0][:P], P)
        prefix_ids = torch.from_numpy(prefix_np)
    pos, next_pos = None, None
    if positions is not None:
        if positions.shape[1] < P + L:  # bucket padding past the longest sequence: keep counting
            extra = torch.arange(1, P + L - positions.shape[1] + 1)
            positions = torch.cat([positions, positions[:, -1:] + extra], dim=1)
        pos = positions[:, : P + L].unsqueeze(1)  # (3, 1, P + L): every question shares the layout
        if P:
            next_pos = int(positions[:, :P].max()) + 1
    patches = image.patches if image is not None else None
    batch = Batch(ids=ids, score_index=torch.from_numpy(score_index), cand_matrix=torch.from_numpy(cand),
                  prefix_ids=prefix_ids, positions=pos, rewards=rewards, pixel_patches=patches,
                  image_tokens=plan.image_tokens, prefix_next_position=next_pos,
                  score_rows=torch.from_numpy(grid), score_slot=torch.from_numpy(slot))
    work = WorkCounts(
        sequences=B, seq_lens=tuple(plan.lengths), padded_len=L, padded_rows=B_pass - B, prefix_len=P,
        candidates=C, scored_rows=B_pass * kmax, score_keys=sum(map(sum, sp)) + C,
        image_tokens=plan.image_tokens, train=train, common_prefix_len=plan.common_prefix(),
    )
    return HostBatch(plan=plan, tensors=batch, work=work, image=image)


def _pack_into(row: np.ndarray, tokens: tuple[int, ...], n: int) -> None:
    """Write n token ids into the first n slots of an int64 row. struct converts Python ints in
    one C loop, 2× faster than numpy's per-element conversion (fromiter, slice assignment,
    np.array: 0.18 vs 0.09 ms for 32 × 512 tokens); "q" is the native 8-byte int, as int64 is."""
    struct.pack_into(f"{n}q", row, 0, *tokens)


def without_patches(hb: HostBatch) -> HostBatch:
    """The same batch minus its pixel patches (the image's features are already cached)."""
    return replace(hb, tensors=replace(hb.tensors, pixel_patches=None))
