"""The frozen-image-feature cache: a model-local LRU of merged vision features.

Vision weights and preprocessing are frozen (LoRA never touches the tower), so the merged
features of an image depend only on its pixels under the preprocessing policy — the
PreparedImage key. One cache belongs to one model instance (loading a model makes a new one);
training and prediction share it. It is bounded by feature bytes, not entries, because one
large image can weigh as much as a hundred small ones.

`features()` serves a whole batch: hits come from the cache, all distinct misses are encoded in
ONE tower call (patches concatenated, grids stacked, output split back per image), and an image
that appears twice in the batch is encoded once. Not thread-safe: call it from the thread that
runs the model.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from collections.abc import Callable, Mapping

import torch

from dohnuts.runtime.images import PreparedImage

DEFAULT_MAX_BYTES = 128 * 2**20

Encoder = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ImageCacheStats:
    """A snapshot of the counters (cumulative since the cache was made) and the current contents.

    hits: images served without encoding, including a repeat of an image encoded earlier in the
    same batch; misses: distinct images encoded; evictions: entries dropped to stay in bounds;
    encode_calls: tower invocations; bytes/entries: what is stored now, bytes <= max_bytes.
    """

    hits: int
    misses: int
    evictions: int
    bytes: int
    entries: int
    encode_calls: int
    max_bytes: int


class ImageFeatureCache:
    """LRU of merged image features keyed by PreparedImage.key, bounded at `max_bytes`."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES):
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, torch.Tensor] = OrderedDict()  # least recently used first
        self._bytes = 0
        self._hits = self._misses = self._evictions = self._encode_calls = 0

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: str) -> bool:
        """Membership without touching the LRU order."""
        return key in self._entries

    def stats(self) -> ImageCacheStats:
        return ImageCacheStats(hits=self._hits, misses=self._misses, evictions=self._evictions, bytes=self._bytes,
                               entries=len(self._entries), encode_calls=self._encode_calls, max_bytes=self.max_bytes)

    def clear(self) -> None:
        """Drop every entry (a cold cache); the cumulative counters stay."""
        self._entries.clear()
        self._bytes = 0

    def features(self, images: list[PreparedImage], encode: Encoder,
                 staged: Mapping[str, torch.Tensor] | None = None) -> list[torch.Tensor]:
        """Merged features (token_count, out_hidden) of each image, in the order given.

        `encode(patches (N, C·Tp·P·P), grid_thw (n, 3) long) -> (Σ token_count, out_hidden)` runs the
        tower on the concatenated misses (it moves them to its device). `staged` maps keys to
        copies of an image's patches already on the device (prefetched by the transfer stream):
        when every miss has one, those are concatenated instead of the host patches. Returned
        tensors are shared with the cache: treat them as read-only.
        """
        found: dict[str, torch.Tensor] = {}
        misses: dict[str, PreparedImage] = {}  # distinct, in first-seen order
        for img in images:
            if img.key in found or img.key in misses:
                self._hits += 1  # repeated in this batch: served without another encode
            elif img.key in self._entries:
                self._entries.move_to_end(img.key)
                found[img.key] = self._entries[img.key]
                self._hits += 1
            else:
                misses[img.key] = img
        if misses:
            found.update(self._encode(list(misses.values()), encode, staged or {}))
        return [found[img.key] for img in images]

    def _encode(self, misses: list[PreparedImage], encode: Encoder,
                staged: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        parts = [staged[img.key] for img in misses] if all(img.key in staged for img in misses) else \
            [img.patches for img in misses]
        for part in parts:  # patches cut on the GPU by a preparing thread's stream: read on this one too
            if part.is_cuda:
                part.record_stream(torch.cuda.current_stream(part.device))
        patches = parts[0] if len(parts) == 1 else torch.cat(parts)  # (Σ N_i, C·Tp·P·P)
        grids = torch.tensor([img.grid_thw for img in misses], dtype=torch.long)  # (n, 3)
        out = encode(patches, grids)  # (Σ token_count_i, out_hidden)
        self._encode_calls += 1
        counts = [img.token_count for img in misses]
        if out.ndim != 2 or out.shape[0] != sum(counts):
            raise RuntimeError(f"encode returned shape {tuple(out.shape)} for {sum(counts)} image tokens")
        self._misses += len(misses)
        result = {}
        # Split into per-image views, then clone so each stored entry owns exactly its own bytes
        # (a view would keep the whole batch's storage alive after its siblings are evicted).
        for img, feats in zip(misses, out.detach().split(counts)):
            feats = feats.clone() if len(misses) > 1 else feats
            result[img.key] = feats
            self._insert(img.key, feats)
        return result

    def _insert(self, key: str, feats: torch.Tensor) -> None:
        size = feats.numel() * feats.element_size()
        if size > self.max_bytes:
            return  # larger than the whole bound: served, never stored
        while self._bytes + size > self.max_bytes:
            _, old = self._entries.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()
            self._evictions += 1
        self._entries[key] = feats
        self._bytes += size
