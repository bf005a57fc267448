"""Pictures of results, shared by several tasks: checked pixels and colours, and turbo colours of
depth (pointmap, depth and clips). A picture only one task makes is in its package
(``sapiens2.tasks.<task>``).

numpy in, uint8 RGB numpy out; no models. Every function is vectorised over pixels and treats
NaN/inf in its inputs as missing (background, hidden point) instead of failing, because model
outputs in half precision can contain them.
"""

from __future__ import annotations

import numbers
from functools import cache
from typing import Any

import cv2
import numpy as np

from ..errors import InputImageError, OptionError

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


def check_hw(arr: np.ndarray, hw: tuple[int, ...], what: str) -> None:
    if tuple(arr.shape[:2]) != tuple(hw[:2]):
        raise InputImageError(f"{what} has size {arr.shape[:2]} but the image is {tuple(hw[:2])}.")


def check_unit(value: Any, what: str) -> float:
    """A number in [0, 1] (numpy scalars included) or an OptionError naming the range."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0.0 <= float(value) <= 1.0:
        raise OptionError(f"{what} must be a number in [0, 1], got {value!r}.")
    return float(value)


def finite(x: np.ndarray, fill: float = 0.0) -> np.ndarray:
    return np.nan_to_num(x, nan=fill, posinf=fill, neginf=fill)


def finite_f32(x: Any) -> np.ndarray:
    """Contiguous float32 array with NaN/inf -> 0; copies only when something needs changing."""
    arr = np.ascontiguousarray(x, dtype=np.float32)
    return arr if np.isfinite(arr).all() else finite(arr)


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


# ---------------------------------------------------------------- depth


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
        check_hw(m, d.shape, "The depth mask")
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
