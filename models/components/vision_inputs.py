"""Host side of the vision tower: pixels -> patches, and the metadata of one packed step.

Preprocessing reproduces HF's Qwen2VLImageProcessor / Qwen2VLVideoProcessor (the processors
Qwen3-Omni uses) in plain torch: those need torchvision (or PIL), which graphc does not depend on.
Resize follows torchvision's tensor path (bicubic, antialias, uint8 resized natively on the CPU),
then rescale + normalise, then HF's patch layout. Frame sampling and RGB conversion stay with the
caller: images come in as RGB [3, H, W] and videos as sampled frames [F, 3, H, W], values 0..255.

Step metadata reproduces transformers.vision_utils (cu_seqlens, rotary position ids, bilinear
pos-embed taps with align_corners=True) for several items packed in one step and padded to the
step's P patches, so VisionEncoder's forward sees only static shapes.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import Field

from graphc import Strict
from models.components.vision import TAPS, VisionConfig

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


class VisionProcessing(Strict):
    """Processor settings; defaults are HF's Qwen2VL processor classes with Qwen3-Omni's patch size
    and video pixel bounds. Set mean/std and image bounds from the checkpoint's preprocessor_config."""

    patch_size: int = Field(16, ge=1)
    temporal_patch_size: int = Field(2, ge=1)
    merge_size: int = Field(2, ge=1)
    min_pixels: int = Field(56 * 56, ge=1)               # images: size.shortest_edge
    max_pixels: int = Field(28 * 28 * 1280, ge=1)        # images: size.longest_edge
    video_min_pixels: int = Field(128 * 32 * 32, ge=1)
    video_max_pixels: int = Field(768 * 32 * 32, ge=1)
    image_mean: tuple[float, float, float] = OPENAI_CLIP_MEAN
    image_std: tuple[float, float, float] = OPENAI_CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


@dataclass(frozen=True)
class VisionItem:
    """One image or video: its patches in HF's order and its grid in patches."""

    patches: torch.Tensor               # [t*h*w, C*T*p*p] fp32 (a host casts it to its node's input dtype)
    grid_thw: tuple[int, int, int]

    @property
    def num_patches(self) -> int:
        t, h, w = self.grid_thw
        return t * h * w


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """HF's smart_resize: sides multiples of factor, area within [min_pixels, max_pixels], aspect kept."""
    if (ratio := max(height, width) / min(height, width)) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_bicubic(frames: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """frames [N, C, H, W] -> [N, C, height, width], as torchvision.transforms.v2.functional.resize
    with bicubic antialias: uint8 is resized natively on the CPU (it rounds differently from the
    float path), elsewhere through fp32 with clamp and round back."""
    if tuple(frames.shape[-2:]) == (height, width):
        return frames
    on_cpu_u8 = frames.dtype == torch.uint8 and frames.device.type == "cpu"
    native = frames.dtype in (torch.float32, torch.float64) or on_cpu_u8
    x = frames if native else frames.float()
    x = F.interpolate(x, size=[height, width], mode="bicubic", align_corners=False, antialias=True)
    if native:
        return x
    if frames.dtype == torch.uint8:
        x = x.clamp_(0, 255)
    return (x.round_() if not frames.dtype.is_floating_point else x).to(frames.dtype)


def normalize_rows(rows: torch.Tensor, cfg: VisionProcessing) -> torch.Tensor:
    """HF's fused rescale (1/255) + normalise, (x - 255*mean) / (255*std) in fp32, over patch rows [N, C*T*p*p]
    (values 0..255, (channel, frame, y, x) in a row), in place on one fp32 copy (the frames are patched while
    still uint8: a quarter of the bytes to move, and no fp32 temporaries)."""
    scale = 1.0 / (1 / 255)      # HF divides by its rescale factor; 255 * mean rounds the same way
    mean = (torch.tensor(cfg.image_mean) * scale).to(rows.device)[:, None]
    std = (torch.tensor(cfg.image_std) * scale).to(rows.device)[:, None]
    x = rows.to(torch.float32, copy=True)
    x.view(x.shape[0], mean.shape[0], -1).sub_(mean).div_(std)
    return x


def _patches(frames: torch.Tensor, height: int, width: int, cfg: VisionProcessing) -> VisionItem:
    """frames [F, C, H, W], values 0..255, resized to height x width, patched, then normalised."""
    patches, grid = patchify(resize_bicubic(frames, height, width), cfg)
    return VisionItem(normalize_rows(patches, cfg), grid)


def patchify(frames: torch.Tensor, cfg: VisionProcessing) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """frames [F, C, H, W] (normalised) -> patches [t*h*w, C*T*p*p] in merge-block order.

    Frames are padded to a multiple of temporal_patch_size by repeating the last one (an image is
    one frame, so T copies of it, as HF's image processor does). Rows run over temporal slices,
    then 2x2 merge blocks in raster order, then the patches of a block in raster order; a row's
    values are (channel, frame, y, x), the Conv3d weight's layout."""
    f, c, hh, ww = frames.shape
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if pad := -f % tp:
        frames = torch.cat((frames, frames[-1:].expand(pad, -1, -1, -1)))
    t, h, w = frames.shape[0] // tp, hh // p, ww // p
    x = frames.reshape(t, tp, c, h // m, m, p, w // m, m, p)
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)      # [t, h/m, w/m, m, m, C, T, p, p]
    return x.reshape(t * h * w, c * tp * p * p), (t, h, w)


def _process(frames: torch.Tensor, cfg: VisionProcessing, min_pixels: int, max_pixels: int) -> VisionItem:
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected RGB frames [F, 3, H, W], got {list(frames.shape)}")
    height, width = smart_resize(frames.shape[-2], frames.shape[-1], cfg.factor, min_pixels, max_pixels)
    return _patches(frames, height, width, cfg)


def process_image(image: torch.Tensor, cfg: VisionProcessing) -> VisionItem:
    """image [3, H, W], values 0..255 (uint8 or float) -> its patches, grid (1, h, w)."""
    return _process(image[None], cfg, cfg.min_pixels, cfg.max_pixels)


def process_video(frames: torch.Tensor, cfg: VisionProcessing) -> VisionItem:
    """Sampled frames [F, 3, H, W], values 0..255 -> patches, grid (ceil(F/T), h, w)."""
    return _process(frames, cfg, cfg.video_min_pixels, cfg.video_max_pixels)

def clip_smart_resize(num_frames: int, height: int, width: int, factor: int, temporal_factor: int, min_pixels: int,
                      max_pixels: int) -> tuple[int, int]:
    """HF Qwen3-VL's video smart_resize: [min_pixels, max_pixels] bound the whole clip (its frames rounded to
    temporal_factor), not each frame; sides multiples of factor, aspect kept; frames smaller than factor are
    scaled up to it first."""
    if num_frames < temporal_factor:
        raise ValueError(f"a clip needs at least {temporal_factor} frames, got {num_frames}")
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if (ratio := max(height, width) / min(height, width)) > 200:
        raise ValueError(f"absolute aspect ratio must be smaller than 200, got {ratio}")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = round(num_frames / temporal_factor) * temporal_factor
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt(num_frames * height * width / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar, w_bar = math.ceil(height * beta / factor) * factor, math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def process_clip(frames: torch.Tensor, cfg: VisionProcessing) -> VisionItem:
    """Qwen3-VL's video processing (Qwen3.5): sampled frames [F, 3, H, W], values 0..255, resized by one pixel
    budget over the clip (video_min_pixels .. video_max_pixels, clip_smart_resize) -> patches, grid."""
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"expected RGB frames [F, 3, H, W], got {list(frames.shape)}")
    height, width = clip_smart_resize(frames.shape[0], frames.shape[-2], frames.shape[-1], cfg.factor,
                                      cfg.temporal_patch_size, cfg.video_min_pixels, cfg.video_max_pixels)
    return _patches(frames, height, width, cfg)



def merge_block_positions(h: int, w: int, merge: int) -> torch.Tensor:
    """(row, col) of each patch of an h x w frame in merge-block order -> [h*w, 2] int64."""
    rows = torch.arange(h)[:, None].expand(h, w)
    cols = torch.arange(w)[None, :].expand(h, w)
    order = [a.reshape(h // merge, merge, w // merge, merge).transpose(1, 2).flatten() for a in (rows, cols)]
    return torch.stack(order, dim=-1)


def _axis_taps(n: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Bilinear taps (align_corners=True) of n target positions into `side` source rows: [n, 2] each.
    The fp32 arithmetic is HF's, so the weights agree bit for bit."""
    src = torch.arange(n, dtype=torch.float32) * (side - 1) / max(n - 1, 1)
    floor = torch.floor(src)
    offsets = torch.arange(2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    weights = (1 - (src[:, None] - floor[:, None] - offsets).abs()).clamp(min=0)
    return taps, weights


def interpolation_taps(h: int, w: int, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of the side x side learned grid each patch of an h x w frame reads, and their weights:
    [h*w, 4] int64 and fp32, taps ordered (top-left, top-right, bottom-left, bottom-right)."""
    pos = merge_block_positions(h, w, merge)
    h_taps, h_w = (t[pos[:, 0]] for t in _axis_taps(h, side))
    w_taps, w_w = (t[pos[:, 1]] for t in _axis_taps(w, side))
    index = (h_taps[:, :, None] * side + w_taps[:, None, :]).reshape(-1, TAPS)
    weight = (h_w[:, :, None] * w_w[:, None, :]).reshape(-1, TAPS)
    return index, weight


@dataclass(frozen=True)
class VisionStep:
    """One packed step of the vision node: its inputs, its attention segments and where each item's
    merged tokens land in the outputs. Rows past `real_patches` are padding."""

    pixel_patches: torch.Tensor         # [P, C*T*p*p] in its items' dtype
    pos_index: torch.Tensor             # [P, 4] int64
    pos_weight: torch.Tensor            # [P, 4] fp32
    rope_pos: torch.Tensor              # [P, 2] int64
    cu_seqlens: list[int]               # segment bounds over all P rows (padding in its own segments)
    grids: list[tuple[int, int, int]]
    token_offsets: list[int]            # item i's merged rows: token_offsets[i]:token_offsets[i+1]
    real_patches: int

    def inputs(self) -> dict[str, torch.Tensor]:
        """The node's inputs by port name (the runtime casts each to its port's dtype where it differs)."""
        return {"pixel_patches": self.pixel_patches, "pos_index": self.pos_index,
                "pos_weight": self.pos_weight, "rope_pos": self.rope_pos}


def segment_bounds(grids: list[tuple[int, int, int]], patches: int, max_segment: int | None = None) -> list[int]:
    """cu_seqlens: one segment per frame slice (h*w rows, t of them per item), as HF's
    get_vision_cu_seqlens; then padding rows in segments of at most max_segment (default: one), so
    every row the attention backend writes is defined."""
    cu = [0]
    for t, h, w in grids:
        for _ in range(t):
            cu.append(cu[-1] + h * w)
    while cu[-1] < patches:
        cu.append(cu[-1] + min(patches - cu[-1], max_segment or patches))
    return cu


@functools.lru_cache(maxsize=256)
def _frame_positions(h: int, w: int, side: int, merge: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One h x w frame's interpolation taps, their weights and its patches' (row, col), kept for the next
    frame of that size (shared: callers copy them, never write them)."""
    return (*interpolation_taps(h, w, side, merge), merge_block_positions(h, w, merge))


def build_step(items: list[VisionItem], cfg: VisionConfig, patches: int | None = None,
               max_segment: int | None = None) -> VisionStep:
    """Pack items (in order) into one step of `patches` rows (default: exactly theirs)."""
    grids = [it.grid_thw for it in items]
    m, real = cfg.spatial_merge_size, sum(it.num_patches for it in items)
    patches = real if patches is None else patches
    if real > patches:
        raise ValueError(f"{real} patches do not fit a step of {patches}")
    for it in items:
        _, h, w = it.grid_thw
        if h % m or w % m or tuple(it.patches.shape) != (it.num_patches, cfg.patch_dim):
            raise ValueError(f"item with grid {it.grid_thw} and patches {list(it.patches.shape)} does not fit "
                             f"merge size {m} and patch dim {cfg.patch_dim}")
    pad = patches - real
    dtype = items[0].patches.dtype if items else torch.float32        # the host's (its node's input dtype)
    pixels = torch.cat([it.patches.to(dtype) for it in items] + [torch.zeros(pad, cfg.patch_dim, dtype=dtype)])
    index, weight, rope = [], [], []
    for (h, w), run in itertools.groupby(grids, key=lambda g: g[1:]):   # a clip's frame groups share a size
        t = sum(g[0] for g in run)
        i, wt, pos = _frame_positions(h, w, cfg.grid_side, m)
        index.append(i.repeat(t, 1)), weight.append(wt.repeat(t, 1)), rope.append(pos.repeat(t, 1))
    index.append(torch.zeros(pad, TAPS, dtype=torch.int64))
    weight.append(torch.zeros(pad, TAPS))       # padding rows get no position embedding
    rope.append(torch.zeros(pad, 2, dtype=torch.int64))
    offsets = [0]
    for it in items:
        offsets.append(offsets[-1] + it.num_patches // cfg.merge_unit)
    return VisionStep(pixels, torch.cat(index), torch.cat(weight), torch.cat(rope),
                      segment_bounds(grids, patches, max_segment), grids, offsets, real)
