"""What one model invocation actually processed: the counts a cost model needs.

The runtime fills a `WorkCounts` for every call it makes; the harness writes it into the raw
JSONL record; the analyzers turn it into useful / padded / repeated FLOPs and bytes. Counts are
in tokens and patches, never in derived FLOPs, so a record can be re-analysed with a better
cost model later.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields, replace


@dataclass(frozen=True)
class WorkCounts:
    sequences: int  # questions (sequences) in the call
    seq_lens: tuple[int, ...]  # real tokens per sequence, shared prefix included
    padded_len: int  # length of the batched (suffix or single) pass after right-padding
    prefix_len: int = 0  # tokens computed once (batch 1) and forked; 0 = no sharing
    candidates: int = 0  # scored positions (scalar head rows)
    # Rows the last layer computed its outputs for: the (B_pass × Kmax) grid of scored positions
    # (its padding included); 0 = every row of the pass (no pruning: records before 2026-12-01's
    # sixth session, and the transformers target). Nonzero also means the prefix pass computed
    # only the state it hands on.
    scored_rows: int = 0
    score_keys: int = 0  # Σ over candidates of (absolute position + 1): the keys the scored queries see
    image_tokens: int = 0  # merged image tokens spliced into the sequences
    encoded_image_patches: tuple[int, ...] = ()  # patches per image the vision tower ran on (cache misses)
    cached_images: int = 0  # images whose features came from the cache
    train: bool = False  # forward + backward (+ optimizer) instead of forward only
    recomputed_tokens: int = 0  # tokens whose forward ran again (activation checkpointing)
    padded_rows: int = 0  # all-padding rows added to the batched pass (a CUDA-graph shape bucket)
    # The prefix every question repeats, whether or not this call shares it: the analysis counts a
    # duplicated prefix as repeated work, so every target is compared on one basis.
    common_prefix_len: int = 0
    # A training update: the batched pass of each of its microbatches (this record's own token
    # fields then hold the totals).
    microbatches: tuple[WorkCounts, ...] = ()

    @property
    def real_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def computed_tokens(self) -> int:
        """Tokens the backbone actually ran: the prefix once plus every row of the batched pass."""
        return self.prefix_len + (self.sequences + self.padded_rows) * self.padded_len

    @property
    def useful_tokens(self) -> int:
        """P + Σ (L_i − P): each real token once (prefix counted once)."""
        return self.real_tokens - (self.sequences - 1) * self.prefix_len if self.prefix_len else self.real_tokens

    @property
    def padded_tokens(self) -> int:
        return self.computed_tokens - self.useful_tokens

    @classmethod
    def of_update(cls, parts: Sequence[WorkCounts]) -> WorkCounts:
        """A training update over its microbatches: totals at the top level, each pass kept. Every
        layer's forward runs again in the backward pass (activation checkpointing, the execution
        policy): counted as recomputed (repeated) work."""
        parts = [replace(w, recomputed_tokens=w.computed_tokens) for w in parts]
        return replace(
            parts[0], sequences=sum(w.sequences for w in parts), seq_lens=tuple(n for w in parts for n in w.seq_lens),
            candidates=sum(w.candidates for w in parts), train=True,
            scored_rows=sum(w.scored_rows for w in parts), score_keys=sum(w.score_keys for w in parts),
            encoded_image_patches=tuple(n for w in parts for n in w.encoded_image_patches),
            cached_images=sum(w.cached_images for w in parts),
            recomputed_tokens=sum(w.recomputed_tokens for w in parts), microbatches=tuple(parts),
        )

    def passes(self) -> tuple[WorkCounts, ...]:
        """The batched passes of the call: its microbatches, or the call itself."""
        return self.microbatches or (self,)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["seq_lens"] = list(self.seq_lens)
        d["encoded_image_patches"] = list(self.encoded_image_patches)
        d["microbatches"] = [m.to_dict() for m in self.microbatches]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WorkCounts:
        """From `to_dict` output, or from a schema-1 record of 2026-11-30, whose prefix length
        and microbatches sat in an untyped `extra` dict."""
        d = dict(d)
        extra = d.pop("extra", None) or {}
        d.setdefault("common_prefix_len", int(extra.get("common_prefix_len", 0) or 0))
        micro = d.get("microbatches") or extra.get("microbatches") or ()
        d["microbatches"] = tuple(cls.from_dict(m) for m in micro)
        d["seq_lens"] = tuple(d["seq_lens"])
        d["encoded_image_patches"] = tuple(d.get("encoded_image_patches", ()))
        return cls(**d)
