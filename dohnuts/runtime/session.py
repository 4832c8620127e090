"""The runtime session: a loaded scoring model and everything around it.

    request ──prepare──▶ HostBatch (plan, tensors, work counts, prepared image)      CPU worker
            ──transfer─▶ device Batch                                               copy stream
            ──features─▶ image features from the 128 MiB frozen-feature cache       compute stream
            ──model────▶ candidate scores (dohnuts.model.ScoringModel, pure)        compute stream
            ──decide───▶ calibrated probabilities and choices

`Session` owns what the pure model must not: the tokenizer, the image-feature cache, the
calibration temperature, the LoRA configuration (attach, merge — one code path each) and the
base identity adapters are verified against. Prediction (dohnuts.runtime.predict) and training
(dohnuts.train.step) both get their batches from `prepare` and their image features from
`image_features`, so what training sees is by construction what prediction sees.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import torch

from dohnuts.config import ModelConfig
from dohnuts.errors import RequestError
from dohnuts.model.lora import LoRAConfig, apply_lora, merge_lora
from dohnuts.model.packing import fuse_projections
from dohnuts.model.scorer import ScoringModel, decide, no_stage
from dohnuts.model.vision import mrope_position_ids
from dohnuts.runtime.batch import Batch, HostBatch, collate, pinned_long, without_patches
from dohnuts.runtime.graphs import PassGraphs, ShapeBuckets
from dohnuts.runtime.image_cache import ImageFeatureCache
from dohnuts.runtime.images import ImageKeyMemo, PendingImage, PreparedImage, pixel_values, prepare_image, start_image
from dohnuts.runtime.plan import plan_request
from dohnuts.runtime.policy import PRODUCT, ExecutionPolicy
from dohnuts.runtime.predict import Predictor
from dohnuts.runtime.requests import Request
from dohnuts.runtime.timing import NULL_TIMER
from dohnuts.runtime.work import WorkCounts


@dataclass(frozen=True)
class ImageUse:
    """How one batch's image was served: its features and whether this call encoded them."""

    features: torch.Tensor  # (m, H) on the device, shared with the cache (read-only)
    encoded_patches: int  # patches the tower ran on for this image in this call (0 = served from the cache)

    def counted(self, work: WorkCounts) -> WorkCounts:
        """`work` with this image's cache outcome (encoded patches, or one cached image)."""
        if self.encoded_patches:
            return replace(work, encoded_image_patches=(self.encoded_patches,), cached_images=0)
        return replace(work, encoded_image_patches=(), cached_images=1)


@functools.lru_cache(maxsize=256)
def image_head_positions(grid: tuple[int, int, int], image_tokens: int, length: int, image_token_id: int,
                         spatial_merge_size: int) -> torch.Tensor:
    """(3, length) MRoPE positions of a planned image sequence — vision_start, the image's
    placeholders at 1..image_tokens, then text (dohnuts.runtime.plan) — which depend on nothing
    but that layout: computed once per (grid, length), not per request (0.07 ms of a request's
    preparation on this project's 2-core CPU, under cProfile). Shared: callers slice it and never write to it."""
    ids = torch.zeros(length, dtype=torch.long)
    ids[1:1 + image_tokens] = image_token_id
    return mrope_position_ids(ids, [grid], image_token_id=image_token_id, spatial_merge_size=spatial_merge_size)


class Session:
    """A scoring model with its tokenizer, image-feature cache, temperature and adapters."""

    def __init__(self, model: ScoringModel, *, tokenizer, base_identity: dict | None = None, max_len: int = 8192,
                 _policy: ExecutionPolicy = PRODUCT):
        # The execution policy is fixed (dohnuts.runtime.policy); `_policy` is internal: the
        # benchmark's measurement-only variants and tests construct sessions with another one.
        self._policy = _policy
        self.model = model
        # Sibling projections run as one GEMM each (dohnuts.model.packing), adapted ones too (their
        # frozen bases packed); merged adapters are new linears, packed again (_modules_changed).
        fuse_projections(model.backbone)
        self.cfg: ModelConfig = model.cfg
        self.tokenizer = tokenizer
        self.base_identity = base_identity or {"config_hash": self.cfg.config_hash()}
        self.max_len = max_len
        self.temperature = 1.0  # calibration temperature (fitted after LoRA merge)
        self.lora: LoRAConfig | None = None  # the attached (unmerged) adapters' configuration
        # A fresh cache per loaded model (the seed: loading a model creates a fresh cache).
        self.image_cache = ImageFeatureCache() if model.visual is not None else None
        self._image_keys = ImageKeyMemo()  # file bytes → content key: cached images skip decoding
        # Inference passes replay CUDA graphs on a GPU (dohnuts.runtime.graphs).
        self.graphs = PassGraphs(model) if _policy.cuda_graphs and model.device.type == "cuda" else None

    @property
    def device(self) -> torch.device:
        return self.model.device

    def forget_images(self) -> None:
        """Forget every image seen: the feature cache and the file memo emptied, as a freshly
        loaded model starts; the next request with an image reads, hashes, decodes and encodes it."""
        if self.image_cache is not None:
            self.image_cache.clear()
        self._image_keys.clear()

    @property
    def policy(self) -> ExecutionPolicy:
        """The execution policy this session runs (`PRODUCT`, or a measurement-only variant)."""
        return self._policy

    # -- adapters ------------------------------------------------------------------------------

    def attach_lora(self, cfg: LoRAConfig, seed: int = 0) -> list[str]:
        """Fresh trainable adapters on the frozen base; the head trains too. Returns adapted names."""
        if self.lora is not None:
            raise ValueError("the model already carries LoRA adapters")
        names = apply_lora(self.model.backbone, cfg, seed=seed)
        self._modules_changed()
        self.lora = cfg
        self.model.head.weight.requires_grad_(True)
        return names

    def merge_lora(self) -> int:
        """Fold the adapters into the frozen base for deployment; returns how many were merged."""
        n = merge_lora(self.model.backbone)
        self._modules_changed()
        self.lora = None
        self.model.head.weight.requires_grad_(False)
        return n

    def _modules_changed(self) -> None:
        fuse_projections(self.model.backbone)  # merged adapters leave plain linears: pack them again
        if self.graphs is not None:
            self.graphs.clear()  # captured graphs point at the replaced modules' weights

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return self.model.trainable_parameters()

    # -- the data path -------------------------------------------------------------------------

    def prepare(self, req: Request, *, train: bool = False, bucket: bool | None = None,
                source: str | None = None) -> HostBatch:
        """CPU work for one request: image decode, tokens, plan (the sharing rule), tensors (pinned
        on CUDA).

        `bucket` pads the batched pass to a CUDA-graph shape (default: for prediction when the
        session replays graphs). Thread-safe (prediction and training call it from worker
        threads). Raises RequestError (ImageError for unusable images) naming the request."""
        image, pending, digest = None, None, None
        if req.image is not None:
            if self.model.visual is None:
                raise RequestError("this model has no vision tower (a text-only checkpoint)",
                                   source=source or req.id, field="image")
            pending, digest = self._start_image(req.image)
            image = pending.image  # on the device path: no key yet, the GPU still unfilters it
        if bucket is None:
            bucket = self.graphs is not None and not train
        try:  # the plan and collate need only the image's grid, token count and patches tensor
            hb = self._plan_and_collate(req, image, train, bucket, source)
        except BaseException:
            if pending is not None:
                pending.wait()  # the device's copies land before their buffers can go
            raise
        if pending is not None:
            image = pending.finish()  # the wait for the device, then the key
            self._image_keys.put(digest, image)
            hb = replace(hb, image=image)
            if image.key in self.image_cache:
                hb = without_patches(hb)  # cached features: no pixels to move (re-read from host if evicted)
        return hb.pinned() if self.device.type == "cuda" else hb

    def _plan_and_collate(self, req: Request, image: PreparedImage | None, train: bool, bucket: bool,
                          source: str | None) -> HostBatch:
        grid, n_img = (image.grid_thw, image.token_count) if image is not None else (None, 0)
        plan = plan_request(req, self.tokenizer, max_len=self.max_len, image_tokens=n_img, image_grid=grid,
                            share_prefix=self._policy.share_prefix, source=source)
        positions = None
        if image is not None:  # (3, T_max): every question shares the image head, so the longest decides
            positions = image_head_positions(grid, n_img, max(plan.lengths), self.cfg.image_token_id,
                                             self.cfg.vision.spatial_merge_size)
        return self._collate(plan, image, train, positions, bucket)

    def _collate(self, plan, image, train: bool, positions, bucket: bool) -> HostBatch:
        shape = None
        if bucket:  # pad the batched pass to the shape of a captured graph
            buckets = self.graphs.buckets if self.graphs is not None else ShapeBuckets()
            shape = buckets.fit(len(plan.sequences), max(plan.lengths) - plan.prefix_len)
        return collate(plan, pad_id=self.tokenizer.special.pad, image=image, train=train, positions=positions,
                       shape=shape, allocate=pinned_long if self.device.type == "cuda" else None)

    def _start_image(self, path: str) -> tuple[PendingImage, str | None]:
        """The image under the fixed policy, its key perhaps still pending (`start_image`), and the
        file digest to remember it by once keyed (None: nothing to remember). An image whose bytes
        were seen before and whose features are cached is not decoded at all (patches None)."""
        digest, data = self._image_keys.read(path)  # a new file's bytes are read here, once
        known = self._image_keys.get(digest)
        if known is not None and known.key in self.image_cache:
            return PendingImage(replace(known, source=path)), None
        return start_image(path if data is None else data, self.cfg.vision, name=path, device=self.device), digest

    def image_features(self, batches: Sequence[tuple[HostBatch, Batch | None]]) -> list[ImageUse | None]:
        """Features of every batch's image through the cache, in ONE call: all distinct misses
        are encoded together, a repeated image once. Device copies of patches a batch already
        holds are used; the rest are copied now. None for batches without an image."""
        # One pass over the batches, as little host work as it can before the tower's launch: a
        # single cold call's GPU idles through all of it (docs/history/evolution.md M62).
        cache, imgs, staged, encodes, seen = self.image_cache, [], {}, [], set()
        for hb, dev in batches:
            img = hb.image
            if img is None:
                continue
            if img.patches is None and img.key not in cache:
                # Prepared without pixels (its features were cached), its entry evicted since:
                # decode it now (rare: the cache filled up between preparation and use).
                img = prepare_image(img.source, self.cfg.vision, device=self.device)
            if dev is not None and dev.pixel_patches is not None:
                staged[img.key] = dev.pixel_patches
            # Which batch encodes its image: the first occurrence of a key not cached before this call.
            encodes.append(img.key not in cache and img.key not in seen)
            seen.add(img.key)
            imgs.append(img)
        if not imgs:
            return [None] * len(batches)
        if torch.is_grad_enabled():  # training's update; prediction runs under inference mode already
            with torch.no_grad():
                found = cache.features(imgs, self._encode_images, staged)
        else:
            found = cache.features(imgs, self._encode_images, staged)
        feats = iter(zip(found, encodes, imgs))
        out = []
        for hb, _ in batches:
            if hb.image is None:
                out.append(None)
                continue
            f, encoded, img = next(feats)
            out.append(ImageUse(f, img.patch_count if encoded else 0))
        return out

    def _encode_images(self, patches: torch.Tensor, grids: torch.Tensor) -> torch.Tensor:
        """The image cache's encoder: uint8 patches, made the tower's float input on the device; the
        grids stay on the host (the tower reads them for shapes only: no device read, so the pass
        can be captured)."""
        patches = patches.to(self.device, non_blocking=True)
        if self.graphs is not None:
            return self.graphs.encode(patches, grids)
        return self.model.encode_images(pixel_values(patches, self.cfg.vision.temporal_patch_size), grids)

    def score(self, hb: HostBatch, dev: Batch, timer=NULL_TIMER) -> tuple[torch.Tensor, WorkCounts]:
        """Prediction scores (C,) FP32 of one prepared request on the device, and its work counts
        (with the image's cache outcome). Call under torch.inference_mode()."""
        feats, use = None, None
        if hb.image is not None:
            with timer.stage("vision"):
                (use,) = self.image_features([(hb, dev)])
            feats = use.features
        work = use.counted(hb.work) if use is not None else hb.work
        stage = timer.stage if timer is not NULL_TIMER else no_stage
        return self._scores(dev.score_inputs(feats), stage), work

    def _scores(self, x, stage=no_stage) -> torch.Tensor:
        h = self.graphs.hidden(x, stage) if self.graphs is not None else None
        if h is None:
            h = self.model.hidden(x, stage=stage)
        with stage("head"):
            return self.model.head_scores(h, x.head_index)

    def decide(self, scores: torch.Tensor, cand_matrix: torch.Tensor):
        """Per question: calibrated probabilities (Q, Kmax) at this session's temperature, choice (Q,),
        the candidates' scores (Q, Kmax; −inf past a question's candidates)."""
        return decide(scores, cand_matrix, self.temperature)

    def predict(self, requests: Iterable[Request]) -> list:
        """Score requests → RequestResult / RequestFailure per request, in order."""
        pred = Predictor(self)
        try:
            return list(pred.run((r.id, r) for r in requests))
        finally:
            pred.close()
