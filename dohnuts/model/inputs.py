"""What one scoring pass consumes: device tensors plus the few host integers that fix shapes.

The runtime (dohnuts.runtime) builds a `ScoreInputs` per request from its batch and the image
features it got from the frozen-feature cache; the model reads nothing else. Every integer here
is known on the host before the pass starts, so a pass never reads the device to decide what to
do next (it can be captured as a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ScoreInputs:
    """One request's model invocation.

    Every sequence is `[image tokens] prefix question candidates`; when `prefix_ids` is given its
    P tokens are computed once (batch 1) and their state is forked into the B rows of `ids`.
    """

    ids: torch.Tensor  # (B, L) long: whole sequences, or the suffixes after the shared prefix
    score_index: torch.Tensor  # (C,) long: flat row indices into the (B·L) hidden states
    prefix_ids: torch.Tensor | None = None  # (1, P) long: the shared prefix, computed once
    positions: torch.Tensor | None = None  # (3, 1, P + L) long: MRoPE positions (image requests only)
    image_features: torch.Tensor | None = None  # (m, H): merged image features, m = image_tokens
    image_tokens: int = 0  # image placeholders at absolute positions 1..image_tokens of every sequence
    prefix_next_position: int | None = None  # rotary position after the prefix (host-known)
    # The scored positions as a grid: row b's candidates at positions score_rows[b, :] of its pass
    # row (padded with a position of the same row), and each candidate's flat index into that
    # (B·Q) grid. Given, a pass computes its last layer's outputs at these positions alone.
    score_rows: torch.Tensor | None = None  # (B, Q) long
    score_slot: torch.Tensor | None = None  # (C,) long

    @property
    def head_index(self) -> torch.Tensor:
        """The candidates' rows in what `ScoringModel.hidden` returns: the (B·Q) grid of
        `score_rows` when given, else the (B·L) rows of the whole pass."""
        return self.score_index if self.score_rows is None else self.score_slot

    @property
    def prefix_len(self) -> int:
        return 0 if self.prefix_ids is None else self.prefix_ids.shape[1]

    @property
    def image_tokens_in_prefix(self) -> int:
        """How many image tokens (absolute positions 1..m) the shared prefix holds (the split may
        cut an image: the rest go to the suffix rows)."""
        if self.image_features is None:
            return 0
        return max(0, min(self.prefix_len - 1, self.image_tokens))
