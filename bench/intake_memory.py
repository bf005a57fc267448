"""Peak memory of reading one big photo with ``sapiens2.inputs.intake.load_image``.

Writes a photo-like JPEG of the given size once (smooth gradients plus sensor-like noise, so its
byte size is like a camera's), then reads it in a fresh process per case and prints that
process's peak RSS (Linux ``VmHWM``, which a fresh process does not inherit, unlike ``ru_maxrss``)
before and after ``load_image``: the difference is what the read itself costs (file bytes, the
decode, the RGB array, the 4096 px working copy).

    python bench/intake_memory.py                        # 12000x9000 (108 MP), baseline JPEG
    python bench/intake_memory.py --progressive          # the same, progressive
    python bench/intake_memory.py --full                 # for comparison: Pillow's limit lifted,
                                                         # decoded at full size as before issue 11
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def write_photo(path: Path, w: int, h: int, progressive: bool) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    x = np.linspace(0, 1, w, dtype=np.float32)[None, :]
    y = np.linspace(0, 1, h, dtype=np.float32)[:, None]
    rgb = np.empty((h, w, 3), np.uint8)
    for c, (a, b) in enumerate([(90, 120), (140, -60), (60, 150)]):
        band = a + b * x * y + 25 * np.sin(40 * x + 30 * y * (c + 1))
        rgb[..., c] = np.clip(band + rng.normal(0, 6, (h, w)).astype(np.float32), 0, 255)
    Image.fromarray(rgb).save(path, "JPEG", quality=90, progressive=progressive)


def peak_rss_mib() -> float:
    status = Path("/proc/self/status")
    if status.exists():
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024  # kB
    import resource  # elsewhere: may include what the parent process had at fork time

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1024 if sys.platform != "darwin" else 2**20)


def measure(path: Path, full: bool) -> None:
    """In this process: peak RSS (MiB) before and after one load_image."""
    from PIL import Image

    from sapiens2.inputs.intake import load_image

    if full:
        Image.MAX_IMAGE_PIXELS = None  # no reduced decode: what a full decode would cost
    before = peak_rss_mib()
    t0 = time.perf_counter()
    intake = load_image(path)
    seconds = time.perf_counter() - t0
    after = peak_rss_mib()
    h, w = intake.rgb.shape[:2]
    print(
        f"{path.stat().st_size / 2**20:.1f} MiB file -> rgb {w}x{h} (reduction 1/{intake.reduction}), "
        f"work {intake.work.shape[1]}x{intake.work.shape[0]}: peak RSS {before:.0f} -> {after:.0f} MiB "
        f"(+{after - before:.0f} MiB) in {seconds:.2f} s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="12000x9000", help="WxH of the test photo (default %(default)s)")
    ap.add_argument("--progressive", action="store_true", help="write a progressive JPEG")
    ap.add_argument("--full", action="store_true", help="decode at full size (Pillow's limit lifted)")
    ap.add_argument("--measure", help=argparse.SUPPRESS)  # internal: the child process
    args = ap.parse_args()
    if args.measure:
        measure(Path(args.measure), args.full)
        return
    w, h = (int(v) for v in args.size.lower().split("x"))
    kind = "progressive" if args.progressive else "baseline"
    path = Path(tempfile.gettempdir()) / f"sapiens2-bench-{w}x{h}-{kind}.jpg"
    if not path.exists():
        write_photo(path, w, h, args.progressive)
    print(f"{w}x{h} {kind} JPEG ({w * h / 1e6:.0f} MP), {'full' if args.full else 'default'} decode:")
    child = [sys.executable, __file__, "--measure", str(path), *(["--full"] if args.full else [])]
    subprocess.run(child, check=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})


if __name__ == "__main__":
    main()
