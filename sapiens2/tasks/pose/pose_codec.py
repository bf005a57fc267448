"""Heatmap decoding for top-down pose: argmax + DARK-UDP sub-pixel refinement, batched in torch.

Equal to the release codec (``UDPHeatmap.decode``): per map the argmax and its value as the score
(location -1 when the score is <= 0); the maps are blurred with an 11x11 Gaussian (zero border,
rescaled to keep each map's maximum), clamped to [1e-3, 50], logged, replicate-padded by one
pixel, and each location takes one Newton step with central-difference gradient and Hessian.
Everything runs on the heatmaps' own device for all people and keypoints at once.

Deliberate differences, each only where the release would produce garbage or crash:
non-finite heatmap values count as 0; points with score <= 0 stay at (-1, -1) (the release
refines them from whatever lies beyond the map's corner); a blurred map whose maximum is 0 is not
rescaled; and where the Newton step is singular (the release raises LinAlgError) or would leave
the blur's reach (``blur_kernel`` px from the argmax on either axis; a flat map: the release's
point lands up to millions of pixels off), the point stays on the argmax cell and its score is
capped at :data:`UNLOCATED_SCORE`. A peak of a trained
model's map (a Gaussian) steps less than half a pixel, so the release's result is kept wherever
its step is well-conditioned.
"""

from __future__ import annotations

from typing import overload

import cv2
import numpy as np
import torch
import torch.nn.functional as F

from ...data.keypoint_sets import keypoint_set
from ...errors import OptionError

#: The score of a point whose map has no located peak (its step is singular or leaves the reach):
#: it stays on the peak's cell, below the 0.3 threshold the drawings, the 3D lift and the
#: formats use by default, since the map does not say where the point is.
UNLOCATED_SCORE = 0.1


def _gaussian_1d(kernel: int, device: torch.device) -> torch.Tensor:
    # cv2.GaussianBlur's sigma for sigma=0 and its normalised kernel (computed in float64)
    sigma = 0.3 * ((kernel - 1) * 0.5 - 1) + 0.8
    x = torch.arange(kernel, dtype=torch.float64) - (kernel - 1) / 2
    g = torch.exp(-(x * x) / (2 * sigma * sigma))
    return (g / g.sum()).to(device=device, dtype=torch.float32)


def _band(n: int, g: torch.Tensor) -> torch.Tensor:
    """(n, n) matrix B with (B @ v)[i] = sum_j g[j] v[i + j - r], zero outside: a 1-D blur."""
    r = len(g) // 2
    i = torch.arange(n, device=g.device)
    d = i[None, :] - i[:, None] + r
    return torch.where((d >= 0) & (d < len(g)), g[d.clamp(0, len(g) - 1)], 0.0)


def _blur(maps: torch.Tensor, kernel: int, use_cv2: bool | None = None) -> torch.Tensor:
    """(M, H, W) float32 -> Gaussian-blurred with a zero border (no rescale).

    ``use_cv2`` (default: on the CPU): OpenCV's separable filter, which is what the release's
    ``cv2.GaussianBlur`` runs (for the 11 px kernel the same values bit for bit), all maps in one
    call: stacked with ``kernel // 2`` zero rows after each, so no map reaches another, and a zero
    constant border. Otherwise two banded matrix products (fast on a GPU, exact zero border).
    Both take the kernel of :func:`_gaussian_1d`.
    """
    m, h, w = maps.shape
    g = _gaussian_1d(kernel, maps.device)
    if maps.device.type == "cpu" if use_cv2 is None else use_cv2:
        r, g1 = kernel // 2, g.cpu().numpy()
        stack = np.zeros((m, h + r, w), np.float32)
        stack[:, :h] = maps.detach().cpu().numpy()
        out = cv2.sepFilter2D(stack.reshape(-1, w), -1, g1, g1, borderType=cv2.BORDER_CONSTANT)
        return torch.from_numpy(out.reshape(m, h + r, w)[:, :h]).to(maps.device)
    return _band(h, g) @ maps @ _band(w, g).T


def _max_ratio(before: torch.Tensor, blurred: torch.Tensor) -> torch.Tensor:
    """(M,) factors that bring each blurred map's maximum back to ``before`` (the map's own
    maximum; 1 where the blurred maximum is 0)."""
    after = blurred.reshape(len(blurred), -1).amax(1)
    return torch.where(after != 0, before / torch.where(after != 0, after, 1.0), 1.0)


def _exact_log3(
    maps: torch.Tensor,
    ids: torch.Tensor,
    xi: torch.Tensor,
    yi: torch.Tensor,
    before: torch.Tensor,
    kernel: int,
) -> torch.Tensor:
    """The release's log of the blurred map, rescaled to ``before`` (each map's maximum) and
    clamped to [1e-3, 50], at the 3x3 around (xi, yi) of the maps ``ids`` (replicate beyond the
    map): (len(ids), 3, 3); ``xi``, ``yi``, ``before`` are those maps'. Whole maps are blurred
    (the rescale needs each blurred map's maximum), a chunk at a time: on the CPU about 1 MiB of
    maps, so a chunk's blur, maximum and nine values are read while it is still in the core's
    cache (twice as fast as all maps at once); only the nine values are rescaled, clamped and
    logged."""
    m, h, w = maps.shape
    chunk = max(1, (1 << 18 if maps.device.type == "cpu" else 1 << 26) // ((h + kernel // 2) * w))
    ar = torch.arange(-1, 2, device=maps.device)
    rows = (yi[:, None] + ar).clamp(0, h - 1)[:, :, None]
    cols = (xi[:, None] + ar).clamp(0, w - 1)[:, None, :]
    out = []
    for s in range(0, len(ids), chunk):
        full = _blur(maps[ids[s : s + chunk]], kernel)
        k = len(full)
        nine = full[torch.arange(k, device=maps.device)[:, None, None], rows[s : s + k], cols[s : s + k]]
        out.append(nine * _max_ratio(before[s : s + k], full)[:, None, None])
    return torch.cat(out).clamp_(1e-3, 50.0).log_()


def _blur_3x3(maps: torch.Tensor, xi: torch.Tensor, yi: torch.Tensor, kernel: int) -> torch.Tensor:
    """Blurred values (no rescale) at the 3x3 pixels around (xi, yi) of each map: (M, 3, 3).

    Reads only a (kernel+2)^2 window per map. Positions beyond the map take the value of the
    nearest edge pixel (the replicate padding the refinement uses).
    """
    m, h, w = maps.shape
    r = kernel // 2 + 1
    g = _gaussian_1d(kernel, maps.device)
    ar = torch.arange(-r, r + 1, device=maps.device)
    rows, cols = yi[:, None] + ar, xi[:, None] + ar  # (M, k+2) window around each argmax
    inside = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
    rc, cc = rows.clamp(0, h - 1)[:, :, None], cols.clamp(0, w - 1)[:, None, :]
    patch = maps[torch.arange(m, device=maps.device)[:, None, None], rc, cc] * inside  # zero border
    band = torch.stack([F.pad(g, (o, 2 - o)) for o in range(3)])  # (3, k+2)
    b3 = band @ patch @ band.T  # (M, 3, 3): rows y-1..y+1, cols x-1..x+1
    # replicate padding at the borders: an outside neighbour repeats the centre row/column
    b3[:, :, 0] = torch.where((xi == 0)[:, None], b3[:, :, 1], b3[:, :, 0])
    b3[:, :, 2] = torch.where((xi == w - 1)[:, None], b3[:, :, 1], b3[:, :, 2])
    b3[:, 0, :] = torch.where((yi == 0)[:, None], b3[:, 1, :], b3[:, 0, :])
    b3[:, 2, :] = torch.where((yi == h - 1)[:, None], b3[:, 1, :], b3[:, 2, :])
    return b3


@overload
def decode_heatmaps(heatmaps: np.ndarray, *, blur_kernel: int = 11) -> tuple[np.ndarray, np.ndarray]: ...
@overload
def decode_heatmaps(
    heatmaps: torch.Tensor, *, blur_kernel: int = 11
) -> tuple[torch.Tensor, torch.Tensor]: ...


def decode_heatmaps(
    heatmaps: np.ndarray | torch.Tensor, *, blur_kernel: int = 11
) -> tuple[np.ndarray, np.ndarray] | tuple[torch.Tensor, torch.Tensor]:
    """(N, K, h, w) heatmaps -> keypoints (N, K, 2) as (x, y) in heatmap pixels and scores (N, K).

    numpy in gives float32 numpy out; torch in gives float32 torch out on the same device.
    ``blur_kernel`` is the DARK modulation kernel (odd; 11 as in the release).
    """
    is_numpy = isinstance(heatmaps, np.ndarray)
    if not is_numpy and not isinstance(heatmaps, torch.Tensor):
        raise OptionError(f"heatmaps must be a numpy array or a torch tensor, got {type(heatmaps).__name__}.")
    hm = torch.from_numpy(np.ascontiguousarray(heatmaps)) if is_numpy else heatmaps
    if hm.ndim != 4 or min(hm.shape[2:]) < 1:
        raise OptionError(f"heatmaps must be shaped (N, K, h, w); got {tuple(hm.shape)}.")
    if not (isinstance(blur_kernel, int) and blur_kernel >= 1 and blur_kernel % 2 == 1):
        raise OptionError(
            f"blur_kernel must be an odd positive integer (11 in the release); got {blur_kernel!r}."
        )
    kp, sc, _ = _decode(hm.detach().float(), blur_kernel)
    if is_numpy:
        return kp.numpy(), sc.numpy()
    return kp, sc


def decode_checked(heatmaps: torch.Tensor, blur_kernel: int = 11) -> tuple[torch.Tensor, torch.Tensor, int]:
    """:func:`decode_heatmaps` for torch input, also returning how many maps held NaN/inf."""
    return _decode(heatmaps.detach().float(), blur_kernel)


def _argmax(flat_maps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(M, h*w) -> each row's maximum and the index of its first maximum (a NaN counts as the
    maximum). On the CPU numpy's vectorised argmax (torch's ``max(dim)`` there is many times
    slower), the same first index."""
    if flat_maps.device.type != "cpu":
        return flat_maps.max(dim=1)
    flat = torch.from_numpy(np.ascontiguousarray(flat_maps.numpy().argmax(1)))
    return flat_maps.gather(1, flat[:, None])[:, 0], flat


def _decode(hm: torch.Tensor, kernel: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    n, k, h, w = hm.shape
    maps = hm.reshape(n * k, h, w)
    scores, flat = _argmax(maps.reshape(n * k, -1))
    bad = torch.nonzero(~torch.isfinite(scores)).flatten()
    if len(bad):  # NaN/inf in a map (max propagates them): count them as 0, in those maps only
        maps = maps.clone()
        maps[bad] = torch.nan_to_num(maps[bad], nan=0.0, posinf=0.0, neginf=0.0)
        scores[bad], flat[bad] = maps[bad].reshape(len(bad), -1).max(dim=1)
    valid = scores > 0
    xi = flat % w
    yi = torch.div(flat, w, rounding_mode="floor")

    # log of the blurred, max-rescaled, clamped map at the 3x3 around each argmax. Fast path:
    # blur just those pixels. Rescaling multiplies a map by origmax/blurmax >= 1 and blurred
    # values never exceed origmax, so when the 3x3 values are >= 1e-3 and origmax <= 50 the clamp
    # is idle and log(ratio) is a constant that cancels in every derivative below.
    b3 = _blur_3x3(maps, xi, yi, kernel)
    log3 = b3.clamp(min=1e-30).log()
    slow = valid & ((b3.reshape(-1, 9).amin(1) < 1e-3) | (scores > 50.0))
    ids = torch.nonzero(slow).flatten()
    if len(ids):  # weak or huge maps: the full blur, exactly as the release does it
        log3[ids] = _exact_log3(maps, ids, xi[ids], yi[ids], scores[ids], kernel)

    # the Newton step in float64 (the release inverts the Hessian in float64 too)
    wide = torch.float32 if hm.device.type == "mps" else torch.float64
    v = log3.to(wide)
    c, left, r, up, down = v[:, 1, 1], v[:, 1, 0], v[:, 1, 2], v[:, 0, 1], v[:, 2, 1]
    gx, gy = 0.5 * (r - left), 0.5 * (down - up)
    eps = float(np.finfo(np.float32).eps)
    hxx = r - 2 * c + left + eps
    hyy = down - 2 * c + up + eps
    hxy = 0.5 * (v[:, 2, 2] - r - down + 2 * c - left - up + v[:, 0, 0])
    det = hxx * hyy - hxy * hxy
    ox = (hyy * gx - hxy * gy) / det
    oy = (hxx * gy - hxy * gx) / det
    ok = valid & (det != 0) & torch.isfinite(ox) & torch.isfinite(oy)
    # the step is trusted within the blur's reach (a kernel's width: the blurred 3x3 holds the raw
    # map up to kernel // 2 + 1 px away; the release's weak, clamped maps step up to ~7 px and
    # are kept). Further out the map is flat (no located peak) and the release's step lands
    # anywhere, up to millions of pixels away.
    ok &= (ox.abs() <= kernel) & (oy.abs() <= kernel)
    x = torch.where(ok, xi - ox, xi.to(wide)).to(torch.float32)
    y = torch.where(ok, yi - oy, yi.to(wide)).to(torch.float32)
    kp = torch.stack([torch.where(valid, x, -1.0), torch.where(valid, y, -1.0)], dim=-1)
    scores = torch.where(valid & ~ok, scores.clamp(max=UNLOCATED_SCORE), scores)
    return kp.reshape(n, k, 2), scores.reshape(n, k), len(bad)


def flip_back(heatmaps: torch.Tensor, flip_index: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Heatmaps of horizontally flipped crops -> heatmaps of the unflipped crops.

    Mirrors each map back (no pixel shift, as in the release) and swaps left/right channels:
    output channel k is the flipped prediction's channel ``flip_index[k]``.
    """
    fi = torch.tensor(np.asarray(flip_index), dtype=torch.long, device=heatmaps.device)
    return heatmaps.flip(-1).index_select(1, fi)


def merge_flip(
    heatmaps: torch.Tensor, flipped: torch.Tensor, flip_index: np.ndarray | torch.Tensor
) -> torch.Tensor:
    """Average plain and flip-back heatmaps (the release's flip test)."""
    return (heatmaps + flip_back(flipped, flip_index)) * 0.5


def heatmap_to_crop(
    keypoints: torch.Tensor, heatmap_hw: tuple[int, int], input_hw: tuple[int, int]
) -> torch.Tensor:
    """Heatmap px -> crop px on the crop's UDP pixel grid: ``x * (W-1)/(w-1)``, ``y * (H-1)/(h-1)``.

    The release writes ``x * W/(w-1)`` and then maps to the image with ``kp/W * scale + c -
    scale/2``; the composition equals this scaling followed by the exact inverse of the UDP crop
    warp (:func:`sapiens2.tasks.pose.pose_crops.warp_matrix`), which is what the pipeline applies.
    """
    h, w = heatmap_hw
    ih, iw = input_hw
    f = torch.tensor([(iw - 1) / max(w - 1, 1), (ih - 1) / max(h - 1, 1)], dtype=keypoints.dtype)
    return keypoints * f.to(keypoints.device)


def decode_crops(
    heatmaps: torch.Tensor, flip_test: bool, crop_hw: tuple[int, int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A forward's heatmaps of N crops (2N with ``flip_test``: the mirrored crops after the plain
    ones) -> (N, K, 2) keypoints in crop pixels, (N, K) scores (K: the model's keypoint set) and (N,) counts of non-finite
    heatmaps. Decoding runs in float32 on the heatmaps' device; only the final arrays come back."""
    # float32 before the flip average and the decoding: a bf16 model's heatmaps hold 8
    # significant bits, which the averaging and DARK's log-derivatives must not lose more of
    heatmaps = heatmaps.float()
    kset = keypoint_set(heatmaps.shape[1])  # 308, or a Sapiens v1 model's 17 / 133
    p = heatmaps.shape[0] // 2 if flip_test else heatmaps.shape[0]
    # maps holding NaN/inf, per crop (the decoder treats those values as 0)
    # (a map's max is NaN or +inf, or its min -inf; amin/amax are one vectorised pass each)
    maps = heatmaps.flatten(2)
    bad = (~(torch.isfinite(maps.amax(-1)) & torch.isfinite(maps.amin(-1)))).sum(1)
    if flip_test:
        bad = bad[:p] + bad[p:]
        heatmaps = merge_flip(heatmaps[:p], heatmaps[p:], kset.flip_index)
    kp_hm, scores, _ = decode_checked(heatmaps)
    kp_crop = heatmap_to_crop(kp_hm, tuple(heatmaps.shape[-2:]), crop_hw)
    return kp_crop.cpu().numpy(), scores.cpu().numpy().astype(np.float32), bad.cpu().numpy()


__all__ = [
    "UNLOCATED_SCORE",
    "decode_checked",
    "decode_crops",
    "decode_heatmaps",
    "flip_back",
    "heatmap_to_crop",
    "merge_flip",
]
