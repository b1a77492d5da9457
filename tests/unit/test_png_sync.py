"""scripts/png_sync.py (used by scripts/gallery.sh): rewrite a PNG only when its pixels change."""
import subprocess
import sys
from pathlib import Path

import numpy as np
from matplotlib.image import imsave

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "png_sync.py"


def test_png_rewritten_only_when_pixels_change(tmp_path):
    src, dst = tmp_path / "build", tmp_path / "figures"
    src.mkdir()
    dst.mkdir()
    img = np.random.default_rng(0).random((20, 30, 3))
    imsave(dst / "a.png", img, metadata={"Software": "old"})
    imsave(src / "a.png", img, metadata={"Software": "new encoder"})     # same pixels, other bytes
    assert (src / "a.png").read_bytes() != (dst / "a.png").read_bytes()
    img2 = img.copy()
    img2[3, 4] = 0
    imsave(dst / "b.png", img)
    imsave(src / "b.png", img2)                                          # one pixel changed
    imsave(dst / "old.png", img)                                         # no longer produced
    before_a = (dst / "a.png").read_bytes()
    out = subprocess.run([sys.executable, str(SCRIPT), str(src), str(dst)], capture_output=True,
                         text=True, check=True).stdout
    assert "1 PNG(s) written, 1 unchanged" in out and "1 removed" in out
    assert (dst / "a.png").read_bytes() == before_a
    assert (dst / "b.png").read_bytes() == (src / "b.png").read_bytes()
    assert not (dst / "old.png").exists()
