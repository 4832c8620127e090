"""The analytic cost of one call: per stage, useful / padded / repeated FLOPs and bytes.

`stage_costs(model, work)` reads only the config and the call's WorkCounts (what the runtime
really processed), so any JSONL record can be re-analysed. Counting rules (component formulas
in flops.py; the rules and their code stay in one module, which is why it is a little long):

Stages (keys of the result, in call order; each on one resource of critical_path.CallGraph):
  h2d       host→device: token ids (int32, 4 B — the vocabulary fits) per computed token; one
            (3, max L) int32 position layout shared by all rows, only when images are present
            (text positions are generated on the device); candidate indices (4 B), training
            rewards (4 B per candidate), image patches in the model dtype (the preprocessing
            policy normalises on the CPU). → host link.
  vision    only when the call encoded images (cache misses): Σ over images of the ViT with
            bidirectional attention within each image. Cached images cost nothing and appear
            as a note; duplicates are encoded once by design, so none are repeated work.
  prefix    the shared prefix, P tokens, batch 1, positions 0..P−1, writes the state it forks.
  suffix    the batched pass over B rows of `padded_len` tokens from position P, every row
            reading the forked state. Without a shared prefix (P = 0) it is named `forward`.
            Unmerged LoRA adapters (training, or `lora.merged` false) add their FLOPs here.
  head      the scalar head: 2·hidden FLOPs per candidate.
  backward  (train only) what the backward must compute with frozen base weights and LoRA:
            input gradients through every frozen projection (= its forward FLOPs) except the
            first layer's input projections (the embeddings are frozen, nothing below needs a
            gradient), NO weight gradients of frozen weights; 2 × forward for the adapters and
            the head (weight and input gradients); 2 × forward for the attention and scan
            matmuls (both operands are activations); 1 × for the depthwise conv (input only);
            ≈ 2 × for element-wise ops. No backward through the frozen vision tower.
            If lora.rank == 0 (head only), the backbone needs no backward at all.
  optimizer (train, LoRA shape known) AdamW over LoRA + head parameters in FP32:
            12 FLOPs and 28 bytes (param r/w, grad r, two moments r/w) per parameter.
  d2h       device→host: one FP32 score per candidate (+ the loss when training).

A training call of several microbatches (WorkCounts.microbatches) is costed per
microbatch and summed per stage; the optimizer runs once per call. `fold_stages` merges stages
that a target times as one interval (the training step's `forward` = prefix + suffix + head).

Useful, padded and repeated work never mix:
  useful    tokens: P + Σ (L_i − P) each computed once; attention over causal pairs only.
  padded    computed − real: right-padding of the batched rows and whole padding rows (a CUDA-graph
            shape bucket: `padded_rows`), tokens and their pairs.
  repeated  (a) duplicated prefixes: work.common_prefix_len = Pc tokens that all
            sequences share, whether or not the target shared them; rows 2..B of a pass recompute
            positions P..Pc−1. (b) activation checkpointing: `recomputed_tokens` re-run the
            forward (charged to `backward`, as the forward work × recomputed / computed tokens).
Bounds use useful work only, so padding and repetition can only lower efficiency.

The last layer's query side (flops.last_layer_query_flops: its query projection, attention of
its queries, output projection, MLP and final norm) is useful only at the scored positions: no
later layer reads the others. Its useful work is the candidates' (and, for attention, the
`score_keys` pairs of their queries); the prefix pass needs none of it (it only hands on state).
A target that computes the last layer at every position (WorkCounts.scored_rows == 0: the
transformers target, older dohnuts records) has the rest counted as padded work ("outputs no
head reads"); one that prunes (scored_rows > 0) computed it on its (B × Kmax) grid of scored
positions, whose padding is padded work.

Necessary bytes (a lower bound, kept simple): every parameter a pass uses is read once per pass
in the model dtype (embeddings: only the looked-up rows); the residual stream crosses each
layer boundary once (read + write), plus the embedding read and the final-norm write; keys and
values are written once; every branch reads the forked prefix state (recurrent FP32 + conv +
KV) once; the prefix pass writes its state once. Intermediates inside a layer are assumed to
stay on chip. Backward: weights once, 3 × hidden per token and layer (saved input, incoming and
outgoing gradient), state gradients once per branch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from dohnuts.bench.analysis.flops import (
    INPUT_PROJECTIONS, LoraShape, attention_pairs, by_kind, last_layer_pair_flops, last_layer_query_flops,
    lora_params, lora_token_flops, patch_values, text_kv_bytes_per_token, text_linears, text_pair_flops, text_params,
    text_state_bytes, text_token_flops, vision_image_flops, vision_params,
)
from dohnuts.config import ModelConfig
from dohnuts.runtime.work import WorkCounts

ID_BYTES = 4  # an int32 token id, position or candidate index
SCORE_BYTES = 4  # FP32 scores and rewards
ADAM_FLOPS, ADAM_BYTES = 12, 28
# Backward FLOPs per forward FLOP, by component (linear is handled per projection, see module doc).
BACKWARD_FACTOR = {"adapter": 2.0, "conv": 1.0, "scan_matmul": 2.0, "scan_solve": 2.0, "elementwise": 2.0,
                   "attention_matmul": 2.0, "softmax": 2.0, "head": 2.0}


@dataclass(frozen=True)
class Work:
    """One slice (useful, padded or repeated) of a stage: FLOPs by component, bytes, tokens."""

    flops: dict[str, float] = field(default_factory=dict)  # component → FLOP (flops.COMPONENT_KIND)
    device_bytes: float = 0.0  # through device memory (HBM / GDDR)
    link_bytes: float = 0.0  # over the host link
    tokens: int = 0
    interconnect_bytes: float = 0.0  # sent by one device to the others (a gradient all-reduce)

    @property
    def total_flops(self) -> float:
        return sum(self.flops.values())

    def kinds(self) -> dict[str, float]:
        """FLOPs by kind of ceiling: matrix, attention, scan, vector."""
        return by_kind(self.flops)

    def __add__(self, other: Work) -> Work:
        flops = dict(self.flops)
        for k, v in other.flops.items():
            flops[k] = flops.get(k, 0.0) + v
        return Work(flops, self.device_bytes + other.device_bytes, self.link_bytes + other.link_bytes,
                    self.tokens + other.tokens, self.interconnect_bytes + other.interconnect_bytes)

    def scaled(self, factor: float) -> Work:
        return Work({k: v * factor for k, v in self.flops.items()}, self.device_bytes * factor,
                    self.link_bytes * factor, round(self.tokens * factor), self.interconnect_bytes * factor)


ZERO = Work()


@dataclass(frozen=True)
class StageCost:
    name: str
    resource: str  # "compute" | "h2d" | "d2h" | "interconnect"
    useful: Work
    padded: Work = ZERO
    repeated: Work = ZERO
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Split:
    """Tokens and causal attention pairs of one text pass, split three ways."""

    useful: tuple[int, int]
    padded: tuple[int, int]
    repeated: tuple[int, int]
    rows_reading_state: int  # branches that read a forked prefix state
    writes_state: bool


def _check(work: WorkCounts) -> int:
    """Validate the counts; returns Pc, the prefix all sequences share (for repeated work)."""
    if work.sequences != len(work.seq_lens) or work.sequences < 1:
        raise ValueError(f"sequences={work.sequences} but seq_lens has {len(work.seq_lens)} entries")
    if work.prefix_len < 0 or (work.prefix_len and any(n <= work.prefix_len for n in work.seq_lens)):
        raise ValueError(f"prefix_len={work.prefix_len} must be shorter than every sequence {list(work.seq_lens)}")
    if work.padded_len < max(n - work.prefix_len for n in work.seq_lens):
        raise ValueError(f"padded_len={work.padded_len} is shorter than the longest suffix")
    common = work.common_prefix_len
    if common > min(work.seq_lens):
        raise ValueError(f"common_prefix_len={common} exceeds the shortest sequence")
    if min(work.candidates, work.image_tokens, work.cached_images, work.recomputed_tokens, work.padded_rows) < 0:
        raise ValueError("counts must not be negative")
    return max(common, work.prefix_len)


def _splits(work: WorkCounts, common: int) -> dict[str, _Split]:
    P, B, T = work.prefix_len, work.sequences, work.padded_len
    R = B + work.padded_rows  # rows the batched pass ran: the questions plus all-padding rows
    real = [n - P for n in work.seq_lens]
    dup = common - P if B > 1 else 0  # positions P..Pc−1 recomputed by rows 2..B
    real_pairs = sum(attention_pairs(P, n) for n in real)
    rep = ((B - 1) * dup, (B - 1) * attention_pairs(P, dup))
    batched = _Split(useful=(sum(real) - rep[0], real_pairs - rep[1]),
                     padded=(R * T - sum(real), R * attention_pairs(P, T) - real_pairs),
                     repeated=rep, rows_reading_state=R if P else 0, writes_state=False)
    if not P:
        return {"forward": batched}
    prefix = _Split(useful=(P, attention_pairs(0, P)), padded=(0, 0), repeated=(0, 0), rows_reading_state=0,
                    writes_state=True)
    return {"prefix": prefix, "suffix": batched}


def _query_tables(m: ModelConfig, lora: LoraShape | None) -> tuple[dict, dict]:
    """Per position and per pair: the forward FLOPs of the last layer's query side."""
    return last_layer_query_flops(m.text, lora), last_layer_pair_flops(m.text)


def _backward_query_tables(per_token: dict, per_pair: dict) -> tuple[dict, dict]:
    """The same, backward: input gradients of frozen projections (1 ×), the rest by BACKWARD_FACTOR."""
    return ({k: v * (1.0 if k == "linear" else BACKWARD_FACTOR[k]) for k, v in per_token.items()},
            {k: v * BACKWARD_FACTOR[k] for k, v in per_pair.items()})


def _last_layer_query_side(cost: StageCost, work: WorkCounts, s: _Split, per_token: dict,
                           per_pair: dict) -> StageCost:
    """Move the last layer's query side of the positions no head reads out of useful work (module
    doc): dropped where the target pruned it (work.scored_rows > 0), counted as padded where it
    computed it anyway."""
    def flops(tokens: float, pairs: float) -> Work:
        f = {k: v * tokens for k, v in per_token.items()}
        for k, v in per_pair.items():
            f[k] = f.get(k, 0.0) + v * pairs
        return Work(f)

    scored, scored_pairs = (0, 0) if s.writes_state else (work.candidates, work.score_keys)
    unread = flops(max(0, s.useful[0] - scored), max(0, s.useful[1] - scored_pairs))
    useful = cost.useful + unread.scaled(-1.0)
    if work.scored_rows:
        padded = cost.padded + flops(*s.padded).scaled(-1.0)
        if not s.writes_state:  # the grid's padding: rows with fewer candidates than Kmax, padding rows
            padded += flops(max(0, work.scored_rows - work.candidates), 0)
        repeated = cost.repeated + flops(*s.repeated).scaled(-1.0)
        return dataclasses.replace(cost, useful=useful, padded=padded, repeated=repeated)
    note = f"last layer's outputs at {s.useful[0] - scored} position(s) no head reads: padded work"
    return dataclasses.replace(cost, useful=useful, padded=cost.padded + unread, notes=cost.notes + (note,))


def _text_slice(tokens: int, pairs: int, per_token: dict, per_pair: dict, token_bytes: float) -> Work:
    """Work of `tokens` tokens and `pairs` attention pairs at the given per-token / per-pair rates."""
    flops = {k: v * tokens for k, v in per_token.items() if v}
    flops.update({k: v * pairs for k, v in per_pair.items() if v})
    return Work(flops, token_bytes * tokens, 0.0, tokens)


def _forward_tables(m: ModelConfig, lora: LoraShape | None, train: bool) -> tuple[dict, dict]:
    per_token = text_token_flops(m.text)
    if lora is not None and (train or not lora.merged):
        per_token["adapter"] = lora_token_flops(m.text, lora)
    return per_token, text_pair_flops(m.text)


def _backward_tables(m: ModelConfig, fwd_token: dict, fwd_pair: dict) -> tuple[dict, dict]:
    # Layer 0's input projections read the (frozen) embeddings: no input gradient is needed.
    linear = sum(2 * lin.params for lin in text_linears(m.text)
                 if not (lin.layer == 0 and lin.module in INPUT_PROJECTIONS))
    per_token = {k: v * BACKWARD_FACTOR[k] for k, v in fwd_token.items() if k != "linear"}
    per_token["linear"] = float(linear)
    return per_token, {k: v * BACKWARD_FACTOR[k] for k, v in fwd_pair.items()}


def stage_costs(model: ModelConfig, work: WorkCounts, dtype_bytes: int = 2,
                lora: LoraShape | None = None) -> dict[str, StageCost]:
    """Per stage of one call: useful / padded / repeated work (see the module docstring).

    A training call of several microbatches (work.microbatches) is costed microbatch by microbatch and summed stage by stage; the optimizer runs once."""
    out = _sum_stages([_batch_costs(model, w, dtype_bytes, lora) for w in batches(work)])
    if work.train:
        if work.recomputed_tokens and "backward" in out:
            out["backward"] = _add_recompute(out, work, sum(w.computed_tokens for w in batches(work)))
        if lora is not None:
            cfg = model.text
            n = lora_params(cfg, lora) + cfg.hidden_size + 1
            out["optimizer"] = StageCost("optimizer", "compute",
                                         Work({"elementwise": float(ADAM_FLOPS * n)}, float(ADAM_BYTES * n), 0.0, 0))
        out["d2h"] = out.pop("d2h")  # keep call order: d2h last
    return out


def batches(work: WorkCounts) -> list[WorkCounts]:
    """The batched passes of a call: the call itself, or its microbatches (train, recompute
    bookkeeping stays with the call)."""
    return [dataclasses.replace(w, train=work.train, recomputed_tokens=0, microbatches=()) for w in work.passes()]


def _sum_stages(parts: list[dict[str, StageCost]]) -> dict[str, StageCost]:
    out: dict[str, StageCost] = {}
    for part in parts:
        for name, c in part.items():
            if name not in out:
                out[name] = c
                continue
            o = out[name]
            out[name] = StageCost(name, o.resource, o.useful + c.useful, o.padded + c.padded, o.repeated + c.repeated,
                                  tuple(dict.fromkeys(o.notes + c.notes)))
    return out


def _batch_costs(model: ModelConfig, work: WorkCounts, db: int, lora: LoraShape | None) -> dict[str, StageCost]:
    """One batched pass (a prediction call or one microbatch): every stage but the optimizer."""
    cfg = model.text
    common = _check(work)
    splits = _splits(work, common)
    out: dict[str, StageCost] = {}
    C = work.candidates
    kv_tok = text_kv_bytes_per_token(cfg, db)
    token_bytes = (2 + 2 * cfg.num_hidden_layers) * cfg.hidden_size * db + kv_tok
    state = text_state_bytes(cfg, db)
    adapters = lora is not None and (work.train or not lora.merged)
    weight_bytes = (text_params(cfg) + (lora_params(cfg, lora) if adapters else 0)) * db

    # h2d: ids per computed token; one position layout shared by every row (images only) ------
    patches = sum(work.encoded_image_patches)
    if patches and model.vision is None:
        raise ValueError("the call encoded image patches but the model has no vision tower")
    positions = 3 * ID_BYTES * max(work.seq_lens) if work.image_tokens else 0
    fixed_in = (C * ID_BYTES * (2 if work.train else 1) + positions
                + (patches * patch_values(model.vision) * db if patches else 0))
    tok = {k: sum(getattr(s, k)[0] for s in splits.values()) for k in ("useful", "padded", "repeated")}
    out["h2d"] = StageCost("h2d", "h2d", Work(link_bytes=tok["useful"] * ID_BYTES + fixed_in, tokens=tok["useful"]),
                           Work(link_bytes=tok["padded"] * ID_BYTES, tokens=tok["padded"]),
                           Work(link_bytes=tok["repeated"] * ID_BYTES, tokens=tok["repeated"]))

    # vision -------------------------------------------------------------------------------
    if patches:
        v = model.vision
        flops: dict[str, float] = {}
        for n in work.encoded_image_patches:
            for k, x in vision_image_flops(v, n).items():
                flops[k] = flops.get(k, 0.0) + x
        vbytes = (vision_params(v) * db + patches * patch_values(v) * db + v.depth * 2 * patches * v.hidden_size * db
                  + patches // v.spatial_merge_size ** 2 * v.out_hidden_size * db)
        notes = (f"{work.cached_images} cached image(s) credited: no vision work",) if work.cached_images else ()
        out["vision"] = StageCost("vision", "compute", Work(flops, vbytes, 0.0, patches), notes=notes)
    elif work.cached_images:
        out["vision"] = StageCost("vision", "compute", ZERO,
                                  notes=(f"all {work.cached_images} image(s) came from the feature cache",))

    # text passes --------------------------------------------------------------------------
    fwd_token, fwd_pair = _forward_tables(model, lora, work.train)
    query = _query_tables(model, lora if adapters else None)
    for name, s in splits.items():
        state_io = s.rows_reading_state * (state + work.prefix_len * kv_tok) + (state if s.writes_state else 0)
        useful = _text_slice(*s.useful, fwd_token, fwd_pair, token_bytes) + Work(device_bytes=weight_bytes + state_io)
        out[name] = _last_layer_query_side(
            StageCost(name, "compute", useful, _text_slice(*s.padded, fwd_token, fwd_pair, token_bytes),
                      _text_slice(*s.repeated, fwd_token, fwd_pair, token_bytes)), work, s, *query)

    # head, backward, d2h ------------------------------------------------------------------
    h = cfg.hidden_size
    out["head"] = StageCost("head", "compute", Work({"head": 2.0 * h * C, "elementwise": float(C)},
                                                    (C * h + h + 1) * db + C * SCORE_BYTES, 0.0, C))
    if work.train:
        out["backward"] = _backward(model, work, splits, lora, fwd_token, fwd_pair, db, state, kv_tok)
    out["d2h"] = StageCost("d2h", "d2h", Work(link_bytes=SCORE_BYTES * (C + (1 if work.train else 0)), tokens=C))
    return out


def _backward(model, work, splits, lora, fwd_token, fwd_pair, db, state, kv_tok) -> StageCost:
    cfg, C, h = model.text, work.candidates, model.text.hidden_size
    useful = Work({"head": 4.0 * h * C}, (C * h + h + 1) * db * 2, 0.0, 0)  # head: weight + input gradients
    if lora is not None and (lora.rank == 0 or not lora.adapted(cfg)):
        return StageCost("backward", "compute", useful, notes=("head-only training: no backward through the backbone",))
    bwd_token, bwd_pair = _backward_tables(model, fwd_token, fwd_pair)
    query = _backward_query_tables(*_query_tables(model, lora))
    grad_bytes = 3 * cfg.num_hidden_layers * h * db  # saved input, incoming and outgoing gradient
    total = StageCost("backward", "compute", useful,
                      notes=("LoRA shape unknown: adapter FLOPs not counted",) if lora is None else ())
    for s in splits.values():
        fixed = text_params(cfg) * db + s.rows_reading_state * (state + work.prefix_len * kv_tok)
        part = StageCost("backward", "compute",
                         _text_slice(*s.useful, bwd_token, bwd_pair, grad_bytes) + Work(device_bytes=fixed),
                         _text_slice(*s.padded, bwd_token, bwd_pair, grad_bytes),
                         _text_slice(*s.repeated, bwd_token, bwd_pair, grad_bytes))
        total = _sum_stages([{"b": total}, {"b": _last_layer_query_side(part, work, s, *query)}])["b"]
    return total


def _add_recompute(costs: dict[str, StageCost], work: WorkCounts, computed: int) -> StageCost:
    """Activation checkpointing: the forward again for `recomputed_tokens`, as repeated work of
    the backward (the forward's FLOPs and bytes × recomputed / computed tokens)."""
    fwd = ZERO
    for name in ("prefix", "suffix", "forward"):
        if name in costs:
            fwd += costs[name].useful + costs[name].padded + costs[name].repeated
    r = fwd.scaled(work.recomputed_tokens / computed) if computed else ZERO
    b = costs["backward"]
    note = f"{work.recomputed_tokens} recomputed token(s) (activation checkpointing) are repeated work"
    return StageCost(b.name, b.resource, b.useful, b.padded,
                     b.repeated + Work(r.flops, r.device_bytes, 0.0, work.recomputed_tokens), b.notes + (note,))


def token_counts(work: WorkCounts) -> dict[str, int]:
    """Backbone tokens of one forward: useful (P + Σ (L_i − P), less duplicated prefixes), padded,
    repeated (duplicated prefixes), summed over microbatches. Recomputed tokens are on top."""
    out = {"useful": 0, "padded": 0, "repeated": 0}
    for w in batches(work):
        for s in _splits(w, _check(w)).values():
            for k in out:
                out[k] += getattr(s, k)[0]
    return out


def call_totals(costs: dict[str, StageCost]) -> dict[str, Work]:
    """The whole call's useful / padded / repeated FLOPs and bytes, summed over stages
    (`tokens` of the sums are meaningless across stages; use token_counts)."""
    out = {"useful": ZERO, "padded": ZERO, "repeated": ZERO}
    for c in costs.values():
        out = {"useful": out["useful"] + c.useful, "padded": out["padded"] + c.padded,
               "repeated": out["repeated"] + c.repeated}
    return out


def fold_stages(costs: dict[str, StageCost], into: str, parts: tuple[str, ...]) -> dict[str, StageCost]:
    """Merge the `parts` stages into one stage `into` (placed where the first part was): for a
    target that times them as one interval (the training step times prefix, suffix and head as
    one `forward`)."""
    present = [p for p in parts if p in costs]
    if not present:
        return costs
    merged = _sum_stages([{into: dataclasses.replace(costs[p], name=into)} for p in present])[into]
    out: dict[str, StageCost] = {}
    for name, c in costs.items():
        if name == present[0]:
            out[into] = merged
        elif name not in present:
            out[name] = c
    return out


def allreduce_cost(gradient_bytes: float, processes: int) -> StageCost:
    """The gradient all-reduce of a data-parallel update over `processes` devices: a ring
    all-reduce sends (and receives) 2(n−1)/n of the buffer per device, the least any all-reduce
    algorithm moves per device for n ≥ 2 (reduce-scatter, then all-gather)."""
    n = max(1, int(processes))
    sent = 2.0 * (n - 1) / n * float(gradient_bytes)
    return StageCost("allreduce", "interconnect", Work(interconnect_bytes=sent),
                     notes=(f"ring all-reduce of {gradient_bytes / 1e6:.2f} MB over {n} devices",))
