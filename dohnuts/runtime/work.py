"""What one model invocation actually processed: the counts a cost model needs.

The runtime fills a `WorkCounts` for every call it makes; the harness writes it into the raw
JSONL record; the analyzers turn it into useful / padded / repeated FLOPs and bytes. Counts are
in tokens and patches, never in derived FLOPs, so a record can be re-analysed with a better
cost model later.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class WorkCounts:
    sequences: int  # questions (sequences) in the call
    seq_lens: tuple[int, ...]  # real tokens per sequence, shared prefix included
    padded_len: int  # length of the batched (suffix or single) pass after right-padding
    prefix_len: int = 0  # tokens computed once (batch 1) and forked; 0 = no sharing
    candidates: int = 0  # scored positions (scalar head rows)
    image_tokens: int = 0  # merged image tokens spliced into the sequences
    encoded_image_patches: tuple[int, ...] = ()  # patches per image the vision tower ran on (cache misses)
    cached_images: int = 0  # images whose features came from the cache
    train: bool = False  # forward + backward (+ optimizer) instead of forward only
    recomputed_tokens: int = 0  # tokens whose forward ran again (activation checkpointing)
    extra: dict = field(default_factory=dict)

    @property
    def real_tokens(self) -> int:
        return sum(self.seq_lens)

    @property
    def computed_tokens(self) -> int:
        """Tokens the backbone actually ran: the prefix once plus every padded suffix row."""
        return self.prefix_len + self.sequences * self.padded_len

    @property
    def useful_tokens(self) -> int:
        """P + Σ (L_i − P): each real token once (prefix counted once)."""
        return self.real_tokens - (self.sequences - 1) * self.prefix_len if self.prefix_len else self.real_tokens

    @property
    def padded_tokens(self) -> int:
        return self.computed_tokens - self.useful_tokens

    def to_dict(self) -> dict:
        d = asdict(self)
        d["seq_lens"] = list(self.seq_lens)
        d["encoded_image_patches"] = list(self.encoded_image_patches)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> WorkCounts:
        d = dict(d)
        d["seq_lens"] = tuple(d["seq_lens"])
        d["encoded_image_patches"] = tuple(d.get("encoded_image_patches", ()))
        return cls(**d)
