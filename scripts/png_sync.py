"""Copy SRC/*.png into DST only where the decoded pixels differ; remove DST PNGs not in SRC.

    python scripts/png_sync.py SRC DST

Used by scripts/gallery.sh: re-encoding the same image can change a PNG's bytes (zlib, metadata)
without changing a pixel, and rewriting tracked figures for that would dirty the tree.
"""
from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
from matplotlib.image import imread


def same_pixels(a: Path, b: Path) -> bool:
    x, y = imread(a), imread(b)
    return x.shape == y.shape and np.array_equal(x, y)


def sync(src: Path, dst: Path) -> tuple[int, int, int]:
    dst.mkdir(parents=True, exist_ok=True)
    new = {p.name for p in src.glob("*.png")}
    written = kept = 0
    for name in sorted(new):
        if (dst / name).exists() and same_pixels(src / name, dst / name):
            kept += 1
            continue
        shutil.copyfile(src / name, dst / name)
        written += 1
    gone = [p for p in dst.glob("*.png") if p.name not in new]
    for p in gone:
        p.unlink()
    return written, kept, len(gone)


if __name__ == "__main__":
    w, k, g = sync(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"gallery: {w} PNG(s) written, {k} unchanged (same pixels), {g} removed")
