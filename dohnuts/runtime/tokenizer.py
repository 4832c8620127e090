"""Tokenization without downloads.

A checkpoint directory with a `tokenizer.json` is tokenized by the `tokenizers` library with the
checkpoint's own vocabulary and special tokens. Presets use `ByteTokenizer`: UTF-8 bytes are ids
0..255 and a handful of special ids follow; it needs no files and every preset's vocabulary
(>= 264 ids) holds it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from dohnuts.config import ModelConfig
from dohnuts.errors import CheckpointError


@dataclass(frozen=True)
class SpecialIds:
    pad: int  # right padding (never seen by a real token: every op is causal)
    score: int  # ends each candidate: the scalar head reads the hidden state at this token
    image: int  # image placeholder, one per merged image patch
    vision_start: int
    vision_end: int


class ByteTokenizer:
    """UTF-8 bytes → ids 0..255; 256 pad, 257 bos, 258 score marker; image ids from the config."""

    name = "bytes"

    def __init__(self, cfg: ModelConfig):
        self.special = SpecialIds(pad=256, score=258, image=cfg.image_token_id,
                                  vision_start=cfg.vision_start_token_id, vision_end=cfg.vision_end_token_id)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text (a request's strings in one call, as `HFTokenizer.encode_many`)."""
        return [list(t.encode("utf-8")) for t in texts]

    @property
    def max_id(self) -> int:
        """The largest id it produces for text (bytes 0..255, pad 256, bos 257, score 258)."""
        return 258


class HFTokenizer:
    """A checkpoint's `tokenizer.json` through the `tokenizers` library."""

    name = "tokenizer.json"

    def __init__(self, path: Path, cfg: ModelConfig):
        try:
            self._tok = Tokenizer.from_file(str(path))
        except Exception as exc:
            raise CheckpointError(f"cannot be read as a tokenizer ({exc})", source=str(path)) from None

        def tid(*names: str) -> int | None:
            for n in names:
                i = self._tok.token_to_id(n)
                if i is not None:
                    return i
            return None

        score = tid("<|im_end|>", "<|endoftext|>", "</s>")
        pad = tid("<|endoftext|>", "<|im_end|>", "<pad>")
        if score is None or pad is None:
            raise CheckpointError("has no <|im_end|> or <|endoftext|> token to mark candidates", source=str(path))
        self.special = SpecialIds(pad=pad, score=score, image=cfg.image_token_id,
                                  vision_start=cfg.vision_start_token_id, vision_end=cfg.vision_end_token_id)
        # The batch encoder without character offsets where the installed tokenizers has it, else the
        # one with them.
        self._encode_batch = getattr(self._tok, "encode_batch_fast", None) or self._tok.encode_batch

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_many(self, texts: list[str]) -> list[list[int]]:
        """`encode` of each text, in ONE call into the library: each text is still tokenized on its
        own (the same ids as `encode`'s), on the library's threads (Rayon; TOKENIZERS_PARALLELISM
        governs them) and without a Python round trip a text (docs/history/evolution.md M51 and M67
        have the times)."""
        return [e.ids for e in self._encode_batch(texts, add_special_tokens=False)]

    @property
    def max_id(self) -> int:
        """The largest id it can produce (its vocabulary, added tokens included, and its specials)."""
        return max(self._tok.get_vocab_size(with_added_tokens=True) - 1, self.special.pad, self.special.score)


def tokenizer_for(cfg: ModelConfig, checkpoint_dir: Path | None) -> ByteTokenizer | HFTokenizer:
    if checkpoint_dir is not None and (checkpoint_dir / "tokenizer.json").exists():
        return HFTokenizer(checkpoint_dir / "tokenizer.json", cfg)
    return ByteTokenizer(cfg)


def check_vocabulary(cfg: ModelConfig, tokenizer, checkpoint_dir: Path | None) -> None:
    """Every id the tokenizer can produce (and, with a vision tower, the image ids) must index the
    model's embedding: a vocabulary smaller than the tokenizer's ids would fail at the first request
    (an IndexError in the embedding). CheckpointError naming config.json's `vocab_size` otherwise."""
    vocab = cfg.text.vocab_size
    needed = {f"the largest id of its tokenizer ({tokenizer.name})": tokenizer.max_id}
    if cfg.vision is not None:
        needed |= {name: getattr(cfg, name) for name in ("image_token_id", "vision_start_token_id",
                                                         "vision_end_token_id")}
    what, largest = max(needed.items(), key=lambda kv: kv[1])
    if largest >= vocab:
        source = str(checkpoint_dir / "config.json") if checkpoint_dir is not None else cfg.name
        raise CheckpointError(f"is {vocab}, but {what} is {largest}: every id must be below vocab_size",
                              source=source, field="vocab_size")
