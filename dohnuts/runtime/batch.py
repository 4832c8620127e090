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
        out = Batch(**moved)
        if packed is not None:  # the device batch's buffer too (`Pipeline.wait` records its stream once)
            object.__setattr__(out, "_packed", (on_device, layout))
        return out

    def pin(self) -> Batch:
        """The batch in page-locked memory (so its host→device copies can be asynchronous). A
        batch collated into a page-locked buffer (`collate(allocate=pinned_long)`) keeps it: only
        its other host tensors (rewards, patches decoded on the host) are pinned."""
        packed = self.__dict__.get("_packed")
        if packed is None or not packed[0].is_pinned():
            return self.packed(pinned_long, _pinned_host)
        changes = {f.name: p for f in fields(self) if f.name not in packed[1]
                   and isinstance(v := getattr(self, f.name), torch.Tensor) and (p := _pinned_host(v)) is not v}
        return self.keeping_buffer(**changes) if changes else self

    def keeping_buffer(self, **changes) -> Batch:
        """`replace(self, **changes)` that keeps the packed buffer (`to` still moves it in one
        copy): `changes` may name only fields outside it (rewards, patches, plain values)."""
        out = replace(self, **changes)
        packed = self.__dict__.get("_packed")
        if packed is not None:
            if any(name in packed[1] for name in changes):
                raise ValueError(f"{sorted(set(changes) & set(packed[1]))} are views of the packed buffer")
            object.__setattr__(out, "_packed", packed)
        return out

    def packed(self, allocate=None, keep=lambda t: t) -> Batch:
        """The batch with its integer (long) tensors as views of ONE buffer from `allocate(n)` (default `torch.empty`),
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
        buf = (allocate or _empty_long)(total)
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
        t = self.tensors.pin()
        return self if t is self.tensors else replace(self, tensors=t)


def collate(plan: RequestPlan, *, pad_id: int, image=None, train: bool = False,
            positions: torch.Tensor | None = None, shape: tuple[int, int] | None = None,
            allocate=None) -> HostBatch:
    """Build the tensors of one request. `positions` (3, T_max) for image requests.

    `shape` (rows, length) pads the batched pass to a CUDA-graph bucket: whole padding rows below
    the questions and right-padding after them (counted as padded work, never as useful).

    The integer tensors are written straight into ONE buffer from `allocate(n)` (a flat int64
    CPU tensor; default `torch.empty`, page-locked where the session is on CUDA): the batch is
    packed as it is built (`Batch.packed`'s layout), and `to` moves it in one copy: no second pass
    copying fresh arrays into a pinned buffer on a single call's critical path (docs/history/
    evolution.md M63)."""
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
    sp = plan.score_positions
    counts = [len(p) for p in sp]
    kmax, C = max(counts), sum(counts)
    if positions is not None and positions.shape[1] < P + L:  # bucket padding past the longest sequence
        extra = torch.arange(1, P + L - positions.shape[1] + 1)
        positions = torch.cat([positions, positions[:, -1:] + extra], dim=1)

    # The layout, in field order (a Batch's integer tensors): name → (offset, shape); each written
    # through a numpy view of the buffer, and handed out as a torch view of it — not `from_numpy`,
    # cheaper, but a per-tensor asynchronous copy from such a tensor records no event on the pinned
    # block, which could then be reused while the copy still reads it.
    sizes = [("ids", (B_pass, L), B_pass * L), ("score_index", (C,), C), ("cand_matrix", (B, kmax), B * kmax)]
    if P:
        sizes.append(("prefix_ids", (1, P), P))
    if positions is not None:
        sizes.append(("positions", (3, 1, P + L), 3 * (P + L)))
    sizes += [("score_rows", (B_pass, kmax), B_pass * kmax), ("score_slot", (C,), C)]
    buf = (allocate or _empty_long)(sum(n for _, _, n in sizes))
    flat = buf.numpy()
    layout, arrays, total = {}, {}, 0
    for name, shp, n in sizes:
        layout[name] = (total, torch.Size(shp))
        arrays[name] = flat[total:total + n].reshape(shp)
        total += n

    ids_np = arrays["ids"]
    ids_np.fill(pad_id)
    for row, s, n in zip(ids_np, seqs, lens):
        _pack_into(row, s[P:] if P else s, n)

    # The scored positions as a (B_pass, Kmax) grid, each row padded with its last one (all-padding
    # rows: position 0) — the pass's last layer computes outputs at the grid alone — then each
    # candidate's slot in it, its flat index into the pass's rows, and the candidate table. A few
    # whole-array numpy calls rather than a loop per question or per candidate: 32 questions × 4
    # candidates took 0.088 ms as lists, and 0.022 ms back to back but 0.07 ms after a 20 ms pause
    # as a dozen numpy calls over flat arrays (each call's code and data cold); 0.016 / 0.028 ms so.
    local = np.array([p + p[-1:] * (kmax - len(p)) for p in sp], dtype=np.int64) - P  # (B, Kmax)
    slot = arrays["score_slot"]
    if C < B * kmax:  # some question has fewer candidates than Kmax: skip its padding slots
        slot[:] = np.flatnonzero(np.arange(kmax) < np.array(counts)[:, None])
    else:
        slot[:] = np.arange(C)
    arrays["score_index"][:] = (local + np.arange(0, B * L, L)[:, None]).ravel()[slot]  # (C,) row · L + position
    cand = arrays["cand_matrix"]
    cand.fill(-1)
    cand.ravel()[slot] = np.arange(C)
    grid = arrays["score_rows"]
    grid[:B] = local
    grid[B:] = 0
    rewards = None
    if train or all(q.rewards is not None for q in plan.request.questions):
        if train:
            require_rewards(plan.request)
        rewards = torch.tensor([list(q.rewards) + [0.0] * (kmax - len(q.rewards)) for q in plan.request.questions],
                               dtype=torch.float32).view(B, kmax)
    if P:
        _pack_into(arrays["prefix_ids"][0], seqs[0][:P], P)
    next_pos = None
    if positions is not None:  # (3, 1, P + L): every question shares the layout
        arrays["positions"][:, 0] = positions[:, : P + L].numpy()
        if P:
            next_pos = int(positions[:, :P].max()) + 1
    views = {name: buf[offset:offset + shape.numel()].view(shape) for name, (offset, shape) in layout.items()}
    patches = image.patches if image is not None else None
    batch = Batch(**views, rewards=rewards, pixel_patches=patches, image_tokens=plan.image_tokens,
                  prefix_next_position=next_pos)
    object.__setattr__(batch, "_packed", (buf, layout))
    work = WorkCounts(
        sequences=B, seq_lens=tuple(plan.lengths), padded_len=L, padded_rows=B_pass - B, prefix_len=P,
        candidates=C, scored_rows=B_pass * kmax, score_keys=sum(map(sum, sp)) + C,
        image_tokens=plan.image_tokens, train=train, common_prefix_len=plan.common_prefix(),
    )
    return HostBatch(plan=plan, tensors=batch, work=work, image=image)


def _empty_long(n: int) -> torch.Tensor:
    return torch.empty(n, dtype=torch.long)


def _pinned_host(t: torch.Tensor) -> torch.Tensor:
    """`t` page-locked if it is a host tensor (patches cut on the GPU stay where they are)."""
    return t if t.device.type != "cpu" or t.is_pinned() else t.pin_memory()


def pinned_long(n: int) -> torch.Tensor:
    """A flat page-locked int64 buffer (torch's caching host allocator: reused once the copies
    that read it are done)."""
    return torch.empty(n, dtype=torch.long, pin_memory=True)


def _pack_into(row: np.ndarray, tokens: tuple[int, ...], n: int) -> None:
    """Write n token ids into the first n slots of an int64 row. struct converts Python ints in
    one C loop, 2× faster than numpy's per-element conversion (fromiter, slice assignment,
    np.array: 0.18 vs 0.09 ms for 32 × 512 tokens); "q" is the native 8-byte int, as int64 is."""
    struct.pack_into(f"{n}q", row, 0, *tokens)


def without_patches(hb: HostBatch) -> HostBatch:
    """The same batch minus its pixel patches (the image's features are already cached)."""
    return replace(hb, tensors=hb.tensors.keeping_buffer(pixel_patches=None))
