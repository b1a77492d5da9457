"""Progress bars (tqdm) that stay quiet when output is not a terminal, e.g. in CI logs."""
from __future__ import annotations

import sys

from tqdm.auto import tqdm


def progress(iterable=None, desc: str = "", total: int | None = None, disable: bool = False, **kw):
    return tqdm(iterable, desc=desc, total=total, disable=disable or not sys.stderr.isatty(),
                dynamic_ncols=True, leave=False, **kw)
