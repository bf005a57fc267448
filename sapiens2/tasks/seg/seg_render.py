"""Segmentation's pictures: palette colours, the blend on the photo, class shares and the legend
(as a picture and as HTML text)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

import cv2
import numpy as np

from ...data.metadata import NUM_SEG_CLASSES, SEG_CLASS_LABELS, SEG_PALETTE, seg_class_ids
from ...errors import InputImageError
from ...outputs.render import as_rgb_uint8, check_hw, check_unit, finite


def _clean_labels(labels: Any) -> np.ndarray:
    lab = np.asarray(labels)
    if lab.ndim != 2:
        raise InputImageError(f"Labels must be an (H, W) array of class ids, got shape {lab.shape}.")
    if not np.issubdtype(lab.dtype, np.integer):  # clip first: the int cast needs a finite range
        lab = np.clip(finite(lab.astype(np.float64), fill=0.0), -1, NUM_SEG_CLASSES).astype(np.intp)
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
    opacity = check_unit(opacity, "Segmentation opacity")
    img = as_rgb_uint8(image)
    lab = _clean_labels(labels)
    check_hw(lab, img.shape, "The label map")
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
