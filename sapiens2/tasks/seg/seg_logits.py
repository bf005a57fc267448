"""The segmentation's logits in compact form (:class:`SegLogits`) and their exact resize.

The device keeps the argmax of the network-resolution logits and the full logit vectors only
around class boundaries; :meth:`SegLogits.labels` is then the argmax of the logits resized
bilinearly to the photo (as ``F.interpolate(align_corners=False)`` then ``argmax``), to the bit,
without ever holding the (C, H, W) tensor: a 12-megapixel photo costs a few uint8 planes instead
of 1.4 GB of float logits. Dense resizes split their rows over the process's CPU pool, each
thread running torch on itself alone (docs/PERFORMANCE.md, "This round").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ...runtime.cpus import available_cpus, cpu_pool
from ...runtime.threads import openmp_function

# finite stand-ins for non-finite logits: a NaN class must never win the argmax
_NEG_FILL, _POS_FILL = -1e30, 1e30
#: Floats per temporary in SegLogits' loops (classes x pixels of a step): a few MB on CPU, so the
#: temporaries stay in the cache, large on GPU (fewer launches). Every loop writes into buffers
#: allocated once: a fresh multi-MB tensor per operation costs its page faults again each time,
#: which made the old per-pixel loop several times slower than its arithmetic.
_STEP = {"cpu": 1 << 20, "cuda": 1 << 26}
#: labels() resizes densely (every output pixel) when at least this fraction of the source cells is
#: mixed; below it, resolving only the mixed pixels is cheaper (crossover: bench/seg_finish.py).
_DENSE_FROM = 0.3
#: the vectorised argmax needs maxima at least this large: the difference of two distinct floats
#: of this size is a normal float, so it cannot be flushed to zero (FTZ/DAZ) and read as a tie
_TINY = 2.0**-100

_Axis = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def _source_index(n_out: int, n_in: int, device: torch.device) -> _Axis:
    """F.interpolate's bilinear sampling (align_corners=False) along one axis: for each output
    index, the two source indices and the weight of the second."""
    scale = torch.tensor(n_in / n_out, dtype=torch.float32)
    src = ((torch.arange(n_out, device=device, dtype=torch.float32) + 0.5) * scale.to(device) - 0.5).clamp_(
        min=0
    )
    i0 = src.long().clamp_(max=n_in - 1)
    i1 = (i0 + 1).clamp_(max=n_in - 1)
    return i0, i1, src - i0


def _mixed_cells(low: torch.Tensor) -> torch.Tensor:
    """(h, w) bool: the source cell (i, j)..(i+1, j+1) has corners of different argmax (edges
    replicate, as the interpolation's clamped indices do)."""
    right = torch.cat([low[:, 1:], low[:, -1:]], 1)
    down = torch.cat([low[1:], low[-1:]], 0)
    diag = torch.cat([right[1:], right[-1:]], 0)
    return (low != right) | (low != down) | (low != diag)


#: Pixels per step of the CPU argmax: the step's class planes (29 x 32 k floats, 3.8 MB) and its
#: hit bytes stay in the cache between the max and the compare.
_CPU_STEP = 1 << 15


def class_argmax(flat: torch.Tensor) -> torch.Tensor | None:
    """(C, N) float logits -> (N,) uint8 ``argmax(0)``, the first class among ties, for C <= 255,
    on the tensor's device; None where a pixel's maximum is NaN or infinite (the caller chooses:
    torch's argmax, or finite logits first). On a GPU one ``max(0)`` gives both.

    numpy's max over the classes and the compare with it are vectorised (torch's and numpy's own
    argmax over a leading axis are not); a class's hit times its rank (the first class ranks
    highest) and a byte max pick the first maximal class: two float passes and two byte passes."""
    if flat.device.type != "cpu":
        best, idx = flat.max(0)
        return idx.to(torch.uint8) if bool(torch.isfinite(best).all()) else None
    flat = flat.float().numpy()  # strided views work as they are
    c, n = flat.shape
    rank = np.arange(c, 0, -1, dtype=np.uint8)[:, None]
    out = np.empty(n, np.uint8)
    step = min(n, _CPU_STEP)
    best = np.empty((1, step), flat.dtype)
    hits = np.empty((c, step), bool)
    for a in range(0, n, step):
        e = min(n, a + step)
        part = flat[:, a:e]
        top = np.max(part, 0, keepdims=True, out=best[:, : e - a])
        if not np.isfinite(top).all():
            return None
        hit = np.equal(part, top, out=hits[:, : e - a]).view(np.uint8)
        np.max(np.multiply(hit, rank, out=hit), 0, out=out[a:e])
    return torch.from_numpy(np.subtract(c, out, out=out))


def _argmax(x: torch.Tensor, dim: int, work: torch.Tensor | None = None) -> torch.Tensor:
    """``x.argmax(dim)`` as uint8 (so at most 256 classes), identical to it: the first index among
    ties, NaN wins.

    torch's argmax over a dim that is not the innermost runs scalar code; max, subtract, sign and
    max are vectorised, about 20x faster (docs/PERFORMANCE.md, "Numbers behind the code"): off the maximum
    ``x - max`` is negative (sign -1), on it exactly 0, and adding each class's rank (the first
    class ranks highest, all ranks in [0, 1)) lets the second max pick the first maximal class.
    Where that would not be exact (a NaN or infinite maximum, or one so small that a difference
    could flush to zero) it is torch's argmax. ``work``: a tensor of x's shape to write into
    (``x`` itself to work in place); default a new one."""
    best = x.amax(dim, keepdim=True)
    low, high = torch.aminmax(best.abs())
    if not (bool(low >= _TINY) and bool(high <= torch.finfo(x.dtype).max)):  # NaN fails both
        return x.argmax(dim).to(torch.uint8)
    c = x.shape[dim]
    scale = float(2 ** math.ceil(math.log2(max(c, 2))))  # a power of two: rank * scale is exact
    shape = [1] * x.dim()
    shape[dim] = c
    rank = torch.arange(c - 1, -1, -1, dtype=x.dtype, device=x.device).div_(scale).view(shape)
    hit = torch.sub(x, best, out=work).sign_().add_(rank)  # < 0 off the maximum, >= 0 on it
    return hit.amax(dim).mul_(-scale).add_(c - 1).to(torch.uint8)


def _beats_background(x: torch.Tensor) -> torch.Tensor | None:
    """(n, C, w) -> (n, w) bool: ``x.argmax(1) != 0``, i.e. some class after the first is strictly
    larger than the first (argmax gives ties to the first index); None where a NaN could decide
    (argmax picks the first NaN), for the caller to take the argmax."""
    rest = x[:, 1:].amax(1)
    first = x[:, 0]
    if bool(rest.isnan().any()) or bool(first.isnan().any()):
        return None
    return rest > first


def _buffer(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.empty(n, dtype=like.dtype, device=like.device)


def _row_pool() -> ThreadPoolExecutor | None:
    """Threads (one per usable CPU) that resize groups of output rows side by side on the CPU,
    each running torch's operations on itself alone; None where there is one CPU or torch's
    OpenMP threads cannot be limited per thread.

    The dense resize is thousands of small operations. With torch's own intra-op threads, each is
    an OpenMP fork and join, and on a virtual machine whose CPUs are not all running at that moment
    each join waits for the CPU that is not (docs/PERFORMANCE.md, "This round"). Whole groups of
    rows on separate threads need no join until the end."""
    limit = openmp_function("omp_set_num_threads")
    if available_cpus() < 2 or limit is None:
        return None
    return cpu_pool("labels", _one_thread, (limit,))


def _one_thread(limit: Callable[[int], int]) -> None:
    """A pool thread's torch operations on this thread only. OpenMP's thread count is per thread;
    torch sets it from its own global value when a thread first asks for it, so that comes first."""
    torch.get_num_threads()
    limit(1)


def _pick(a: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``a[rows][:, cols]`` of a 2-D uint8 or bool map (on the CPU numpy's take, faster than
    torch's index_select for bytes)."""
    by_rows = len(rows) <= a.shape[0]  # gather columns (the slow part) on the fewer rows
    if a.device.type == "cpu":
        r, c = rows.numpy(), cols.numpy()
        m = a.numpy()
        return torch.from_numpy(m.take(r, 0).take(c, 1) if by_rows else m.take(c, 1).take(r, 0))
    return (
        a.index_select(0, rows).index_select(1, cols)
        if by_rows
        else a.index_select(1, cols).index_select(0, rows)
    )


@dataclass
class SegLogits:
    """Network-resolution logits kept only where an argmax after bilinear resizing can need them.

    An output pixel mixes the logit vectors of the 4 source pixels around it; when those 4 share
    one argmax, a convex mix of them has that argmax too. So the argmax (``low``) decides every
    pixel except those whose source cell is mixed, and those need the full logit vectors of the
    cell's 4 corners: ``index`` (flat source indices) and ``values`` (their logits, float32,
    channel-first: column gathers, the dense path's row blocks and a channel-first argmax are fast).
    A person photo's logits are a few percent of the 29 x 1024 x 768 (91 MB) float32 tensor.
    """

    low: torch.Tensor  # (h, w) uint8 argmax at network resolution
    index: torch.Tensor  # (N,) int32 flat indices of the corners of mixed cells
    values: torch.Tensor  # (C, N) float32 their logits

    @classmethod
    def from_logits(cls, logits: torch.Tensor) -> SegLogits:
        """(C, h, w) float logits (on any device) -> the compact form on the same device."""
        c, h, w = logits.shape
        flat = logits.float().reshape(c, h * w)
        # torch's argmax over classes is scalar code on the CPU; on a GPU it is fast, and the
        # finite check would only add a sync
        low = class_argmax(flat) if flat.device.type == "cpu" and c <= 255 else None
        if low is None:  # (or a NaN or infinite maximum: torch's argmax, NaN wins, as the release)
            low = flat.argmax(0).to(torch.uint8)
        low = low.view(h, w)
        mixed = _mixed_cells(low)
        need = mixed.clone()  # a pixel is needed when it is a corner of a mixed cell
        need[:, 1:] |= mixed[:, :-1]
        need[1:] |= mixed[:-1]
        need[1:, 1:] |= mixed[:-1, :-1]
        index = need.flatten().nonzero().squeeze(1)
        # a copy either way: flat may be a view of a whole batch's logits
        picked = flat.clone() if index.numel() == h * w else flat.index_select(1, index)  # all: no gather
        return cls(low, index.to(torch.int32), picked)

    def cpu(self) -> SegLogits:
        return SegLogits(self.low.cpu(), self.index.cpu(), self.values.cpu())

    def labels(self, out_hw: tuple[int, int], *, dense: bool | None = None) -> torch.Tensor:
        """(H, W) uint8 = argmax of the logits resized bilinearly (``F.interpolate``,
        ``align_corners=False``) to ``out_hw``, computed without the (C, H, W) tensor.

        Unmixed cells take ``low``; a mixed cell's pixels mix its corners' logits in float32,
        x first (``v00 * (1 - ax) + v01 * ax``), then y. Two paths do that with the same
        operations, so they agree to the bit: the sparse one visits only the mixed cells'
        pixels; the dense one (``dense=None``: chosen when many cells are mixed, as with a random
        model's salt-and-pepper logits) resizes strips of output rows separably, every pixel."""
        return self._resized(out_hw, dense, foreground=False)

    def foreground(self, out_hw: tuple[int, int], *, dense: bool | None = None) -> torch.Tensor:
        """(H, W) bool = ``labels(out_hw) != 0`` (not the background class), exactly, for the
        tasks that borrow only the person mask. The dense path then skips the argmax: a pixel is
        foreground when some other class's mixed logit beats the background's (a tie goes to the
        background, the first class, as argmax has it); strips holding a NaN take the argmax."""
        return self._resized(out_hw, dense, foreground=True)

    def _resized(self, out_hw: tuple[int, int], dense: bool | None, foreground: bool) -> torch.Tensor:
        h, w = self.low.shape
        out_h, out_w = int(out_hw[0]), int(out_hw[1])
        dev = self.low.device
        ys, xs = _source_index(out_h, h, dev), _source_index(out_w, w, dev)
        mixed = _mixed_cells(self.low)
        if dense is None:
            dense = int(mixed.sum()) >= _DENSE_FROM * mixed.numel()
        if dense:
            return self._dense_labels(out_h, out_w, mixed, ys, xs, foreground)
        labels = self._sparse_labels(out_h, out_w, mixed, ys, xs)
        return labels != 0 if foreground else labels

    def _sparse_labels(
        self, out_h: int, out_w: int, mixed: torch.Tensor, ys: _Axis, xs: _Axis
    ) -> torch.Tensor:
        h, w = self.low.shape
        c = self.values.shape[0]
        dev = self.low.device
        (y0, _, wy), (x0, _, wx) = ys, xs
        labels = _pick(self.low, y0, x0)  # exact wherever the cell is unmixed
        ci, cj = mixed.nonzero().unbind(1)  # the mixed cells, row-major
        # cell (i, j) covers the output rows y with y0[y] == i and the columns x with x0[x] == j:
        # a block (empty when shrinking skips i or j), as y0 and x0 ascend
        row_first = torch.searchsorted(y0, torch.arange(h, device=dev))
        col_first = torch.searchsorted(x0, torch.arange(w, device=dev))
        row_n, col_n = torch.bincount(y0, minlength=h), torch.bincount(x0, minlength=w)
        cols = col_n[cj]
        count = row_n[ci] * cols  # output pixels per cell
        ends = count.cumsum(0)  # pixel ranges per cell, in one numbering of all mixed pixels
        # each cell's 4 corners as columns of values (the interpolation's second index clamps at the edge)
        ci1, cj1 = (ci + 1).clamp_(max=h - 1), (cj + 1).clamp_(max=w - 1)
        flat = [(a * w + b).to(torch.int32) for a, b in ((ci, cj), (ci, cj1), (ci1, cj), (ci1, cj1))]
        corners = [torch.searchsorted(self.index, f) for f in flat]  # index ascends and holds them all
        bx, by = 1 - wx, 1 - wy
        step = max(1, _STEP.get(dev.type, _STEP["cuda"]) // c)
        total = int(ends[-1]) if len(ends) else 0
        if not total:  # no mixed cell, or none that an output pixel samples
            return labels
        biggest = int(count.max())
        bufs = [_buffer(c * (min(step, total) + biggest), self.values) for _ in corners]
        # steps of whole cells, about `step` pixels each
        cuts = torch.searchsorted(ends, torch.arange(0, total, step, device=dev), right=True).tolist()
        for s, e in zip(cuts, [*cuts[1:], len(ci)], strict=True):
            if s == e:
                continue
            first = int(ends[s - 1]) if s else 0
            n = int(ends[e - 1]) - first
            cell = torch.repeat_interleave(torch.arange(s, e, device=dev), count[s:e], output_size=n)
            offset = torch.arange(first, first + n, device=dev) - (ends[cell] - count[cell])
            dy = torch.div(offset, cols[cell], rounding_mode="floor")
            yy = row_first[ci[cell]] + dy
            xx = col_first[cj[cell]] + offset - dy * cols[cell]

            v = [
                torch.index_select(self.values, 1, at[cell], out=buf[: c * n].view(c, n))
                for at, buf in zip(corners, bufs, strict=True)
            ]
            ax, ay, bxx = wx[xx], wy[yy], bx[xx]
            top = v[0].mul_(bxx).add_(v[1].mul_(ax))
            bottom = v[2].mul_(bxx).add_(v[3].mul_(ax))
            mix = top.mul_(by[yy]).add_(bottom.mul_(ay))
            labels[yy, xx] = _argmax(mix, 0, mix)
        return labels

    def _dense_labels(
        self, out_h: int, out_w: int, mixed: torch.Tensor, ys: _Axis, xs: _Axis, foreground: bool = False
    ) -> torch.Tensor:
        h, w = self.low.shape
        c = self.values.shape[0]
        dev = self.low.device
        (y0, y1, wy), (x0, x1, wx) = ys, xs
        if self.index.numel() == h * w:  # every pixel kept (index is then 0..h*w-1 in order)
            full = self.values
        else:  # the pixels no mixed cell needs only reach unmixed outputs, overwritten below; a
            # large stand-in keeps their maxima away from 0, where _argmax would take its slow path
            full = self.values.new_full((c, h * w), _POS_FILL).index_copy_(1, self.index.long(), self.values)
        # (h, C, w): a strip's source rows are one block, a source row's classes rows of w columns
        src = full.view(c, h, w).transpose(0, 1).contiguous()
        bx, by = 1 - wx, 1 - wy
        every = bool(mixed.all())
        out = torch.empty((out_h, out_w), dtype=torch.bool if foreground else torch.uint8, device=dev)
        low = self.low != 0 if foreground else self.low
        row = c * out_w  # floats per x-resized source row, and per output row before the argmax
        step = max(1, _STEP.get(dev.type, _STEP["cuda"]) // row)
        first, last = y0.tolist(), y1.tolist()
        strips = [(a, min(out_h, a + step)) for a in range(0, out_h, step)]

        def resize(group: list[tuple[int, int]]) -> None:
            """The strips of ``group`` (consecutive) into ``out``, with buffers of its own."""
            most = max(last[b - 1] + 1 - first[a] for a, b in group)  # source rows one strip reads
            # this strip's x-resized rows, and the last's
            along = [_buffer(most * row, src) for _ in range(2)]
            spare = _buffer(max(most, step) * row, src)
            mix = _buffer(step * row, src)
            done = (0, 0)  # source rows in along[1]
            for a, b in group:
                lo, hi = first[a], last[b - 1] + 1
                rows = along[0][: (hi - lo) * row].view(hi - lo, row)
                kept = max(0, min(done[1], hi) - lo) if lo >= done[0] else 0  # rows the last strip resized
                if kept:
                    rows[:kept].copy_(
                        along[1][(lo - done[0]) * row : (lo - done[0] + kept) * row].view(kept, row)
                    )
                if hi > lo + kept:
                    block = src[lo + kept : hi].view(-1, w)
                    n = (hi - lo - kept) * c
                    part = torch.index_select(block, 1, x0, out=rows[kept:].view(n, out_w)).mul_(bx)
                    part += torch.index_select(block, 1, x1, out=spare[: n * out_w].view(n, out_w)).mul_(wx)
                along.reverse()
                done = (lo, hi)
                k = (b - a) * row
                top = torch.index_select(rows, 0, y0[a:b] - lo, out=mix[:k].view(b - a, row)).mul_(
                    by[a:b, None]
                )
                bottom = torch.index_select(rows, 0, y1[a:b] - lo, out=spare[:k].view(b - a, row))
                top += bottom.mul_(wy[a:b, None])
                both = top.view(b - a, c, out_w)
                lab = _beats_background(both) if foreground else None
                if lab is None:
                    lab = _argmax(both, 1, both)
                    lab = lab != 0 if foreground else lab
                if not every:
                    lab = torch.where(_pick(mixed, y0[a:b], x0), lab, _pick(low, y0[a:b], x0))
                out[a:b] = lab

        pool = _row_pool() if dev.type == "cpu" else None
        if pool is None or len(strips) < 2:
            resize(strips)
        else:  # the strips in as many consecutive groups as the pool has threads
            n = min(len(strips), available_cpus())  # the pool's size
            groups = [strips[len(strips) * i // n : len(strips) * (i + 1) // n] for i in range(n)]
            for job in [pool.submit(resize, g) for g in groups]:
                job.result()
        return out


def finite_logits(logits: torch.Tensor, notices: list[str]) -> torch.Tensor:
    """Non-finite logits replaced by finite stand-ins (a NaN class never wins), with a notice."""
    # the extremes answer it in one vectorised pass each (a NaN propagates into both); a whole
    # isfinite mask is a full-size temporary, about 9x slower on a CPU
    low, high = torch.aminmax(logits)
    if bool(torch.isfinite(low)) and bool(torch.isfinite(high)):
        return logits
    notices.append("The segmentation model returned non-finite values; they were ignored.")
    return torch.nan_to_num(logits.float(), nan=_NEG_FILL, posinf=_POS_FILL, neginf=_NEG_FILL)


__all__ = ["SegLogits", "class_argmax", "finite_logits"]
