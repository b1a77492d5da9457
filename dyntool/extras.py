"""Optional dependencies: the one way dyntool imports a package that an extra installs.

A missing optional package is the user's environment, not a bug: :func:`need` turns the
``ImportError`` into one line naming the extra that installs it (``pip install 'dyntool[scale]'``),
which the CLI prints as ``dyntool: error: …`` with exit 2.  :class:`MissingExtra` is also an
``ImportError``, so code that already falls back on ``except ImportError`` keeps working.
"""
from __future__ import annotations

import importlib

from .errors import DyntoolError

# top-level module -> the extra of pyproject.toml that installs it (keep in step with pyproject)
EXTRAS = {
    "obstore": "scale", "dask": "scale", "distributed": "scale",
    "xarray": "export", "pyarrow": "export", "h5netcdf": "export", "h5py": "export",
    "tensorboard": "tensorboard", "wandb": "wandb",
    "huggingface_hub": "data",
    "transformers": "hf", "accelerate": "hf",
    "lightning": "lightning", "pytorch_lightning": "lightning",
    "transformer_lens": "tl",
    "triton": "kernels",
}


class MissingExtra(DyntoolError, ImportError):
    """An optional package is not installed; the message names the extra (one line, exit 2)."""


def hint(module: str, what: str | None = None) -> str:
    """``"<what needs> X is not installed; pip install 'dyntool[extra]'"`` for module ``X``."""
    top = module.split(".")[0]
    extra = EXTRAS.get(top)
    fix = f"pip install 'dyntool[{extra}]'" if extra else f"pip install {top}"
    return f"{what + ': ' if what else ''}{top} is not installed; {fix}"


def need(module: str, what: str | None = None, error: type[DyntoolError] = MissingExtra):
    """Import ``module`` (e.g. ``"dask.array"``) or raise ``error`` with :func:`hint`'s line.

    Only a missing package becomes that line: an ImportError raised *inside* an installed package
    (a broken install) names the module that failed instead of blaming the extra."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing = getattr(e, "name", None) or module
        if missing.split(".")[0] != module.split(".")[0]:
            raise error(f"{what + ': ' if what else ''}importing {module} failed: {e}") from None
        raise error(hint(module, what)) from None
