"""Pictures of results: skeletons, segmentation blends and legends, colour maps, composites, PCA.

numpy in, uint8 RGB numpy out; no models. Every function is vectorised over pixels and treats
NaN/inf in its inputs as missing (background, hidden point) instead of failing, because model
outputs in half precision can contain them.
"""

from __future__ import annotations

import html
import numbers
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import cv2
import numpy as np

from ..data.metadata import (
    KEYPOINT_COLORS,
    KEYPOINT_GROUPS,
    NUM_KEYPOINTS,
    NUM_SEG_CLASSES,
    SEG_CLASS_LABELS,
    SEG_PALETTE,
    SKELETON,
    seg_class_ids,
)
from ..errors import InputImageError, OptionError

CHROMA_GREEN: tuple[int, int, int] = (0, 177, 64)
BOX_COLOR: tuple[int, int, int] = (0, 255, 0)
_SHIFT = 4  # cv2 fixed-point bits: draw at 1/16 px so antialiased lines sit at sub-pixel spots
_COORD_LIMIT = 1e5  # far-off coordinates are clipped here so the int32 fixed point never overflows


# ---------------------------------------------------------------- shared helpers


def as_rgb_uint8(image: Any) -> np.ndarray:
    """(H, W, 3) uint8 RGB from a numpy array or PIL image of any common mode.

    Gray (H, W) / (H, W, 1) is repeated, RGBA is composited over white (as the intake does),
    uint16 is scaled down, floats are taken as 0..255 with NaN -> 0.
    """
    if hasattr(image, "mode") and hasattr(image, "convert"):  # PIL image
        if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
            image = image.convert("RGBA")
        elif image.mode != "RGB":
            image = image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype == np.uint16:
        arr = (arr >> 8).astype(np.uint8)
    elif arr.dtype == bool:
        arr = arr.astype(np.uint8) * 255
    elif arr.dtype != np.uint8:
        arr = np.clip(np.nan_to_num(arr.astype(np.float32), nan=0.0), 0, 255).round().astype(np.uint8)
    if arr.ndim == 3 and arr.shape[2] == 1:
        arr = arr[:, :, 0]
    if arr.ndim == 2:
        return np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4) or arr.shape[0] == 0 or arr.shape[1] == 0:
        raise InputImageError(f"Expected an (H, W), (H, W, 3) or (H, W, 4) image, got shape {arr.shape}.")
    if arr.shape[2] == 4:
        a = arr[:, :, 3:].astype(np.uint16)
        rgb = (arr[:, :, :3].astype(np.uint16) * a + 255 * (255 - a) + 127) // 255
        return rgb.astype(np.uint8)
    return np.ascontiguousarray(arr)


def _check_hw(arr: np.ndarray, hw: tuple[int, ...], what: str) -> None:
    if tuple(arr.shape[:2]) != tuple(hw[:2]):
        raise InputImageError(f"{what} has size {arr.shape[:2]} but the image is {tuple(hw[:2])}.")


def _check_unit(value: Any, what: str) -> float:
    """A number in [0, 1] (numpy scalars included) or an OptionError naming the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise OptionError(f"{what} must be a number in [0, 1], got {value!r}.")
    return float(value)


def _finite(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    return np.nan_to_num(x, nan=fill, posinf=fill, neginf=fill)


def finite_f32(x: Any) -> np.ndarray:
    """Contiguous float32 array with NaN/inf -> 0; copies only when something needs changing."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    return arr if np.isfinite(arr).all() else _finite(arr)


def finite_pixels(x: np.ndarray) -> np.ndarray:
    """(H, W) bool: all channels of the float32 (H, W, C<=4) pixel are finite.

    0 * x is NaN exactly where x is NaN/inf, and cv2.transform sums the channels in one fast
    pass (numpy's .all(axis=2) over 3 channels is ~6x slower on a 12 MP image).
    """
    return np.isfinite(cv2.transform(x, np.zeros((1, x.shape[2]), np.float32)))


def to_uint8(x: np.ndarray, scale: float = 1.0, offset: float = 0.0) -> np.ndarray:
    """saturate(round(x * scale + offset)) as uint8, in one cv2 pass (same channels as x)."""
    return cv2.addWeighted(x, scale, x, 0.0, offset, dtype=cv2.CV_8U)


def parse_color(color: Any) -> tuple[int, int, int]:
    """(r, g, b) 0-255 from a tuple/list, '#rrggbb'/'#rgb', or 'rgb(r, g, b)'/'rgba(r, g, b, a)'
    (the forms colour pickers return)."""
    if isinstance(color, str) and color.strip().lower().startswith("rgb"):
        inner = color.strip()[color.find("(") + 1 : color.rfind(")")] if "(" in color else ""
        try:
            return parse_color([float(v) for v in inner.split(",")[:3]] if inner.count(",") >= 2 else [])
        except ValueError:
            raise OptionError(f"Colour {color!r} is not of the form 'rgb(r, g, b)'.") from None
    if isinstance(color, str):
        s = color.strip().lstrip("#")
        if len(s) == 3:
            s = "".join(c * 2 for c in s)
        try:
            if len(s) not in (6, 8):
                raise ValueError
            return (int(s[0:2], 16), int(s[2:4], 16), int(s[4:6], 16))
        except ValueError:
            raise OptionError(
                f"Colour {color!r} is not a '#rrggbb' hex string or an (r, g, b) tuple."
            ) from None
    vals = list(np.asarray(color).ravel()) if color is not None else []
    if len(vals) != 3 or not all(np.isfinite(v) and 0 <= v <= 255 for v in vals):
        raise OptionError(f"Colour {color!r} must be three numbers in 0-255 (r, g, b) or a '#rrggbb' string.")
    return tuple(int(round(float(v))) for v in vals)  # type: ignore[return-value]


# ---------------------------------------------------------------- pose


def pose_style(height: int, width: int) -> tuple[int, int]:
    """(line thickness, point radius) in px for an image: both grow with the long side.

    thickness = max(1, round(long / 500)), radius = max(2, round(long / 320)): 2 and 3 px at
    1024 px, 4 and 6 px at 1920 px. Face points (238 of them, densely packed) use radius // 2.
    """
    long_side = max(int(height), int(width))
    return max(1, round(long_side / 500)), max(2, round(long_side / 320))


def _drawable_mask(show_face: bool, body_only: bool) -> np.ndarray:
    allowed = np.ones(NUM_KEYPOINTS, dtype=bool)
    if body_only:
        allowed[:] = False
        allowed[KEYPOINT_GROUPS["body"]] = True
        allowed[KEYPOINT_GROUPS["foot"]] = True
    if not show_face:
        allowed[KEYPOINT_GROUPS["face"]] = False
    return allowed


def _pose_arrays(keypoints: Any, scores: Any) -> tuple[np.ndarray, np.ndarray]:
    kp = np.asarray(keypoints, dtype=np.float64)
    if kp.ndim == 2:
        kp = kp[None]
    if kp.ndim != 3 or kp.shape[1:] != (NUM_KEYPOINTS, 2):
        raise InputImageError(f"keypoints must have shape (P, {NUM_KEYPOINTS}, 2), got {kp.shape}.")
    sc = np.asarray(scores, dtype=np.float64)
    if sc.size != kp.shape[0] * NUM_KEYPOINTS:
        raise InputImageError(f"scores must have shape ({kp.shape[0]}, {NUM_KEYPOINTS}), got {sc.shape}.")
    return kp, sc.reshape(kp.shape[:2])


def _fixed_point(xy: np.ndarray) -> np.ndarray:
    return np.round(np.clip(_finite(xy), -_COORD_LIMIT, _COORD_LIMIT) * (1 << _SHIFT)).astype(np.int32)


def draw_pose(
    image: Any,
    keypoints: Any,
    scores: Any,
    *,
    threshold: float = 0.3,
    show_face: bool = True,
    body_only: bool = False,
    boxes: Any = None,
) -> np.ndarray:
    """Skeletons drawn on a copy of the image: links first (antialiased), then filled points.

    keypoints (P, 308, 2) in image px (x, y), scores (P, 308). A point is drawn when its score
    is >= threshold and it is finite; a link when both its ends are drawn. body_only keeps the
    body and foot groups; show_face=False hides the face group. Sizes: see ``pose_style``.
    """
    threshold = _check_unit(threshold, "Keypoint threshold")
    canvas = as_rgb_uint8(image).copy()
    kp, sc = _pose_arrays(keypoints, scores)
    h, w = canvas.shape[:2]
    thickness, radius = pose_style(h, w)
    visible = np.isfinite(kp).all(-1) & np.isfinite(sc) & (sc >= threshold)
    visible &= _drawable_mask(show_face, body_only)[None]
    radii = np.full(NUM_KEYPOINTS, radius << _SHIFT, dtype=np.int64)
    radii[KEYPOINT_GROUPS["face"]] = max(1, radius // 2) << _SHIFT
    if boxes is not None:
        _draw_boxes(canvas, boxes, max(1, thickness // 2))
    # plain Python values for cv2's calls (per-element numpy access costs more than the drawing)
    pts, seen, radii_px = _fixed_point(kp).tolist(), visible.tolist(), radii.tolist()
    for p in range(kp.shape[0]):
        at, on = pts[p], seen[p]
        for i, j, color in SKELETON:
            if on[i] and on[j]:
                cv2.line(canvas, at[i], at[j], color, thickness, cv2.LINE_AA, _SHIFT)
        for k in np.flatnonzero(visible[p]).tolist():
            cv2.circle(canvas, at[k], radii_px[k], _POINT_COLORS[k], -1, cv2.LINE_AA, _SHIFT)
    return canvas


_POINT_COLORS = [tuple(int(c) for c in rgb) for rgb in KEYPOINT_COLORS]  # cv2 colours, made once


def _draw_boxes(canvas: np.ndarray, boxes: Any, thickness: int) -> None:
    b = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    for x1, y1, x2, y2 in _fixed_point(b[np.isfinite(b).all(1)]).reshape(-1, 4):
        cv2.rectangle(canvas, (x1, y1), (x2, y2), BOX_COLOR, thickness, cv2.LINE_AA, _SHIFT)


# ---------------------------------------------------------------- segmentation


def _clean_labels(labels: Any) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.ndim != 2:
        raise InputImageError(f"Labels must be an (H, W) array of class ids, got shape {lab.shape}.")
    if not np.issubdtype(lab.dtype, np.integer):  # clip first: the int cast needs a finite range
        lab = np.clip(_finite(lab.astype(np.float64), fill=0.0), -1, NUM_SEG_CLASSES).astype(np.intp)
    if lab.size and (lab.min() < 0 or lab.max() >= NUM_SEG_CLASSES):
        lab = np.where((lab >= 0) & (lab < NUM_SEG_CLASSES), lab, 0)  # unknown ids count as background
    return lab  # uint8 maps stay uint8: no 8-byte copy of a large image


def label_ids(labels: Any) -> np.ndarray:
    """(H, W) uint8 class ids as :func:`colorize_labels` reads them (unknown ids -> background),
    so ``SEG_PALETTE[label_ids(x)]`` is ``colorize_labels(x)``."""
    return _clean_labels(labels).astype(np.uint8, copy=False)


def colorize_labels(labels: Any) -> np.ndarray:
    """(H, W) class ids -> (H, W, 3) uint8 palette colours (out-of-range ids -> background)."""
    return SEG_PALETTE[_clean_labels(labels)]


def class_shares(labels: Any) -> np.ndarray:
    """(29,) fraction of pixels per class id (sums to 1 for a non-empty map)."""
    lab = _clean_labels(labels)
    counts = np.bincount(lab.ravel(), minlength=NUM_SEG_CLASSES).astype(np.float64)
    return counts / max(1, lab.size)


def blend_segmentation(
    image: Any, labels: Any, *, opacity: float = 0.5, classes: Sequence[int | str] | None = None
) -> np.ndarray:
    """image * (1 - opacity) + palette colour * opacity, background class included (as the release).

    classes: ids or names to keep; pixels of any other class show the plain photo.
    """
    opacity = _check_unit(opacity, "Segmentation opacity")
    img = as_rgb_uint8(image)
    lab = _clean_labels(labels)
    _check_hw(lab, img.shape, "The label map")
    out = cv2.addWeighted(img, 1.0 - opacity, SEG_PALETTE[lab], opacity, 0.0)
    if classes is not None:
        keep = np.zeros(NUM_SEG_CLASSES, dtype=bool)
        keep[seg_class_ids(classes)] = True
        out = np.where(keep[lab][:, :, None], out, img)
    return out


#: Legend layout: text readable when the page shows the legend at about its own size.
LEGEND_FONT_SCALE, LEGEND_ROW_H, LEGEND_PAD, LEGEND_SWATCH, LEGEND_ROWS_PER_COLUMN = 0.8, 36, 10, 24, 8


def segmentation_legend(
    class_ids: Sequence[int], shares: Mapping[int, float] | Sequence[float] | np.ndarray | None = None
) -> np.ndarray:
    """A white legend image: one entry per class id given (swatch, name, optional percentage),
    in columns of at most :data:`LEGEND_ROWS_PER_COLUMN` so the legend stays wide, not tall.

    shares: fraction per class, as a mapping id -> fraction or a length-29 sequence (e.g. from
    ``class_shares``). A class whose share would print as 0.0% is left out. Ids are listed once,
    in the order given.
    """
    ids = list(dict.fromkeys(int(c) for c in class_ids))
    seg_class_ids(ids)  # raises OptionError (listing the valid classes) for an unknown id
    ids = [c for c in ids if _share_text(shares, c) != _share_text({c: 0.0}, c)]  # not "0.0%"
    rows = [SEG_CLASS_LABELS[c] + _share_text(shares, c) for c in ids] or ["(none)"]
    font, scale, thick = cv2.FONT_HERSHEY_SIMPLEX, LEGEND_FONT_SCALE, 2
    pad, row_h, swatch, per_col = LEGEND_PAD, LEGEND_ROW_H, LEGEND_SWATCH, LEGEND_ROWS_PER_COLUMN
    col_w = pad * 3 + swatch + max(cv2.getTextSize(t, font, scale, thick)[0][0] for t in rows)
    n_cols = -(-len(rows) // per_col)
    canvas = np.full((pad * 2 + row_h * min(len(rows), per_col), pad + col_w * n_cols, 3), 255, np.uint8)
    for r, text in enumerate(rows):
        x, y = pad + (r // per_col) * col_w, pad + (r % per_col) * row_h
        if ids:
            canvas[y + 6 : y + 6 + swatch, x : x + swatch] = SEG_PALETTE[ids[r]]
        cv2.putText(canvas, text, (x + swatch + pad, y + 26), font, scale, (0, 0, 0), thick, cv2.LINE_AA)
    return canvas


def segmentation_legend_html(
    class_ids: Sequence[int], shares: Mapping[int, float] | Sequence[float] | np.ndarray | None = None
) -> str:
    """The legend of :func:`segmentation_legend` as HTML text a screen reader and a browser's
    search can read: a list of the classes' names for people ("Right upper leg") with their
    shares, each after a swatch of its colour (hidden from screen readers)."""
    ids = list(dict.fromkeys(int(c) for c in class_ids))
    seg_class_ids(ids)
    ids = [c for c in ids if _share_text(shares, c) != _share_text({c: 0.0}, c)]
    if not ids:
        return "<p>No body part found.</p>"
    items = []
    for c in ids:
        r, g, b = (int(v) for v in SEG_PALETTE[c])
        swatch = (
            f'<span aria-hidden="true" style="display:inline-block;width:0.9em;height:0.9em;'
            f'margin-right:0.4em;vertical-align:-0.1em;border:1px solid #8886;background:rgb({r},{g},{b})"></span>'
        )
        share = _share_text(shares, c).strip()
        items.append(f"<li>{swatch}{html.escape(SEG_CLASS_LABELS[c])}{f': {share}' if share else ''}</li>")
    style = "list-style:none;margin:0;padding:0;columns:3 11em;line-height:1.6"
    head = '<p style="margin:0 0 0.3em"><strong>Body parts found</strong> (share of the photo)</p>'
    return f'{head}<ul class="sapiens2-legend" aria-label="Body parts found" style="{style}">{"".join(items)}</ul>'


def _share_text(shares: Any, c: int) -> str:
    if shares is None:
        return ""
    value = shares.get(c) if isinstance(shares, Mapping) else shares[c]
    if value is None or not np.isfinite(value):
        return ""
    return f"  {100.0 * float(value):.1f}%"


# ---------------------------------------------------------------- normals and depth


def _background(background: Any, hw: tuple[int, int]) -> np.ndarray:
    if isinstance(background, str) and background in ("black", "white"):
        return np.full((*hw, 3), 0 if background == "black" else 255, np.uint8)
    if isinstance(background, str):
        raise OptionError(f"Background must be 'black', 'white' or an image, got {background!r}.")
    bg = as_rgb_uint8(background)
    _check_hw(bg, hw, "The background image")
    return bg


def normals_to_rgb(normals: Any, mask: Any = None, background: Any = "black") -> np.ndarray:
    """(H, W, 3) unit normals -> RGB = (n + 1) / 2 * 255 with x->R, y->G, z->B.

    mask: (H, W) bool, True on the person; elsewhere (and where the normal is not finite) the
    background shows: "black", "white" or an (H, W, 3) image such as the photo.
    """
    n = np.ascontiguousarray(normals, dtype=np.float32)
    if n.ndim != 3 or n.shape[2] != 3:
        raise InputImageError(f"Normals must be an (H, W, 3) array, got shape {n.shape}.")
    valid = finite_pixels(n)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        _check_hw(m, n.shape, "The normal mask")
        valid &= m
    out = _background(background, n.shape[:2]).copy()
    cv2.copyTo(to_uint8(n, 127.5, 127.5), valid.view(np.uint8), out)  # non-finite pixels stay background
    return out


@cache
def turbo_lut() -> np.ndarray:
    """(256, 3) uint8 turbo colour table (matplotlib's), built once."""
    from matplotlib import colormaps  # lazy: matplotlib import costs ~0.3 s

    lut = colormaps["turbo"](np.linspace(0.0, 1.0, 256))[:, :3]
    out = np.round(lut * 255).astype(np.uint8)
    out.setflags(write=False)
    return out


def depth_to_turbo(
    depth: Any,
    mask: Any = None,
    *,
    percentiles: tuple[float, float] = (1.0, 99.0),
    background: int | tuple[int, int, int] = 100,
    bounds: tuple[float, float] | None = None,
) -> np.ndarray:
    """Turbo colours of inverse depth (1/Z) on the foreground; background grey.

    Bounds: the foreground depth at the given percentiles, or ``bounds=(near, far)`` in depth
    units when given (e.g. one pair for every frame of a clip, so colours do not flicker); the
    near bound maps to the red end of turbo (LUT[255]), the far bound to the blue end (LUT[0]),
    values beyond are clipped.
    Foreground = mask & finite & Z > 0 (mask None: every such pixel). An empty foreground gives
    an all-background image.
    """
    lo_p, hi_p = percentiles
    if not 0.0 <= lo_p < hi_p <= 100.0:
        raise OptionError(f"Depth percentiles must satisfy 0 <= low < high <= 100, got {percentiles!r}.")
    d = np.asarray(depth)
    d = d if d.dtype in (np.float32, np.float64) else d.astype(np.float32)
    if d.ndim != 2:
        raise InputImageError(f"Depth must be an (H, W) array, got shape {d.shape}.")
    bg = parse_color((background,) * 3 if np.isscalar(background) else background)
    lut = np.vstack([turbo_lut(), np.array([bg], np.uint8)])  # row 256 = background
    fg = np.isfinite(d) & (d > 0)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        _check_hw(m, d.shape, "The depth mask")
        fg &= m
    out = np.empty((*d.shape, 3), np.uint8)
    scale = None  # (1/far, 1/near - 1/far), or None: a flat foreground shown mid-scale
    if fg.any():
        near, far = np.percentile(d[fg], [lo_p, hi_p]) if bounds is None else _check_bounds(bounds)
        inv_near, inv_far = 1.0 / near, 1.0 / far
        span = inv_near - inv_far
        # a flat foreground (one depth) has no range: show it mid-scale instead of dividing by zero
        scale = (inv_far, span) if span > 1e-12 * inv_near else None
    # Blocks of rows, so each step's temporaries (float64 at a 48 MP photo would be ~1.5 GB) stay
    # small; every pixel gets the same operations as on the whole picture at once.
    rows = max(1, _RENDER_BLOCK // max(1, d.shape[1]))
    for a in range(0, d.shape[0], rows):
        f = fg[a : a + rows]
        index = np.full(f.shape, 256, np.uint16)
        if f.any():
            vals = d[a : a + rows][f]
            t = (1.0 / vals - scale[0]) / scale[1] if scale else np.full(vals.shape, 0.5)
            index[f] = np.round(np.clip(t, 0.0, 1.0) * 255)
        # np.take along axis 0 copies whole rows (~4x faster at 12 MP than lut[index], which goes
        # through fancy indexing's general path): same values
        np.take(lut, index, axis=0, out=out[a : a + rows])
    return out


#: pixels per block of :func:`depth_to_turbo`
_RENDER_BLOCK = 1 << 20


def _check_bounds(bounds: Any) -> tuple[float, float]:
    try:
        near, far = (float(v) for v in bounds)
    except (TypeError, ValueError):
        raise OptionError(f"Depth bounds must be two numbers (near, far), got {bounds!r}.") from None
    if not (np.isfinite(near) and np.isfinite(far) and 0 < near <= far):
        raise OptionError(f"Depth bounds must be (near, far) with 0 < near <= far, got {bounds!r}.")
    return near, far


# ---------------------------------------------------------------- matting


def cover_resize(image: Any, hw: tuple[int, int]) -> np.ndarray:
    """RGB uint8 image scaled to COVER (H, W) (aspect kept), then centre-cropped to it.

    The crop is taken in the source first, so a 2 x 10000 strip never becomes a huge image.
    """
    img = as_rgb_uint8(image)
    h, w = int(hw[0]), int(hw[1])
    ih, iw = img.shape[:2]
    scale = max(h / ih, w / iw)
    ch, cw = max(1, min(ih, round(h / scale))), max(1, min(iw, round(w / scale)))
    top, left = (ih - ch) // 2, (iw - cw) // 2
    crop = img[top : top + ch, left : left + cw]
    if (ch, cw) == (h, w):
        return np.ascontiguousarray(crop)
    interp = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(np.ascontiguousarray(crop), (w, h), interpolation=interp)


def matte_arrays(foreground: Any, alpha: Any) -> tuple[np.ndarray, np.ndarray]:
    """Checked float32 (H, W, 3) foreground and (H, W) alpha with NaN/inf as 0."""
    fg = finite_f32(foreground)
    a = finite_f32(alpha)
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if fg.ndim != 3 or fg.shape[2] != 3 or a.shape != fg.shape[:2]:
        raise InputImageError(
            f"Expected foreground (H, W, 3) and alpha (H, W), got {fg.shape} and {a.shape}."
        )
    return fg, a


def composite(foreground: Any, alpha: Any, background: Any = None) -> np.ndarray:
    """clamp(fg + (1 - alpha) * bg) as uint8 RGB; fg is premultiplied RGB in [0, 1].

    background: None (chroma green (0, 177, 64)), an (r, g, b) tuple or '#rrggbb', or an image
    (numpy (H', W'), (H', W', 3|4) or PIL, any size: resized to cover, centre-cropped).
    NaN/inf in fg count as 0 and in alpha as 0 (background shows).
    """
    fg, a = matte_arrays(foreground, alpha)
    colour = None
    if (
        background is None
        or isinstance(background, (str, tuple, list))
        or (isinstance(background, np.ndarray) and background.ndim == 1)
    ):
        colour = parse_color(CHROMA_GREEN if background is None else background)
    inv = np.clip(a, 0.0, 1.0)
    np.subtract(1.0, inv, out=inv)
    # One (H, W, 3) float32 buffer, updated in place: at 12 MP each fresh 144 MB temporary costs
    # more in page faults than the arithmetic done in it (0.8 s -> 0.15 s, the same bytes).
    out = cv2.merge([inv, inv, inv])
    if colour is not None:
        cv2.multiply(out, (*colour, 0), dst=out)  # per-channel scalar
    else:
        cv2.multiply(out, cover_resize(background, fg.shape[:2]), dst=out, dtype=cv2.CV_32F)
    # fg * 255 + (1 - alpha) * bg in 0..255, then one saturating rounding (cv2: fast on 12 MP)
    cv2.scaleAdd(fg, 255.0, out, dst=out)
    return to_uint8(out)


# ---------------------------------------------------------------- backbone features


def _top3_components(x: np.ndarray) -> np.ndarray:
    """(D, 3) leading principal directions of centred rows x (N, D), via a small randomised SVD."""
    n, d = x.shape
    k = min(3, n, d)
    x = x / max(float(np.abs(x).max()), 1e-30)  # scale-free directions; huge values cannot overflow
    if d <= 64 or n <= 64:
        _, _, vt = np.linalg.svd(x, full_matrices=False)
        comps = vt[:k].T
    else:  # range finder + 2 power iterations: O(N*D*k), fast enough for 2048-wide features
        rng = np.random.default_rng(0)  # fixed seed: the same picture for the same input
        q = np.linalg.qr(x @ rng.standard_normal((d, k + 8)))[0]
        for _ in range(2):
            q = np.linalg.qr(x @ (x.T @ q))[0]
        _, _, vt = np.linalg.svd(q.T @ x, full_matrices=False)
        comps = vt[:k].T
    # fix each component's sign (SVD signs are arbitrary) so colours are stable between runs
    proj = x @ comps
    proj = proj / (np.abs(proj).max(axis=0) + 1e-30)
    signs = np.sign(np.sum(proj**3, axis=0))
    comps = comps * np.where(signs == 0, 1.0, signs)
    return np.pad(comps, ((0, 0), (0, 3 - k))).astype(np.float32)


def pca_rgb(features: Any, out_hw: tuple[int, int] | None = None, mask: Any = None) -> np.ndarray:
    """Patch features (D, h, w) -> uint8 RGB of their first 3 principal components.

    Fitted on the patches inside mask ((h, w) or any size, resized nearest; None = all) with
    finite values; each component is stretched to 0-255 between its 1st and 99th percentile;
    patches outside the mask are black. out_hw=(H, W) resizes the picture (bilinear).
    """
    f = np.asarray(features, dtype=np.float32)
    if f.ndim != 3:
        raise InputImageError(f"Features must be a (D, h, w) array, got shape {f.shape}.")
    d, h, w = f.shape
    valid = np.isfinite(f).all(axis=0).ravel()
    if mask is not None:
        m = np.asarray(mask, dtype=np.uint8)
        if m.shape != (h, w):
            m = cv2.resize(m, (w, h), interpolation=cv2.INTER_NEAREST)
        valid &= m.ravel().astype(bool)
    rgb = np.zeros((h * w, 3), np.float32)
    if valid.sum() >= 2:
        x = np.ascontiguousarray(f.reshape(d, h * w).T)  # (N, D) patch vectors, float32 throughout
        x[~valid] = 0.0
        x -= x[valid].mean(axis=0, dtype=np.float64).astype(np.float32)
        proj = x @ _top3_components(x if valid.all() else x[valid])
        lo, hi = np.percentile(proj[valid], [1.0, 99.0], axis=0)
        rgb = np.clip((proj - lo) / np.maximum(hi - lo, 1e-12), 0.0, 1.0).astype(np.float32) * 255.0
        rgb[~valid] = 0.0
    img = np.clip(rgb.reshape(h, w, 3) + 0.5, 0, 255).astype(np.uint8)
    if out_hw is not None:  # resized as uint8: at photo size a float copy is 12 bytes per pixel
        img = cv2.resize(img, (int(out_hw[1]), int(out_hw[0])), interpolation=cv2.INTER_LINEAR)
    return img
