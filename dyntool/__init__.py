"""dyntool: record and explore the gradient dynamics of attention.

Public API::

    import dyntool
    run = dyntool.open_run("runs/sticky/seed42-em")   # config, meta, metrics (DataFrame), lazy arrays
    run.arrays["attn"][-1, 0, 0, 0]                     # last recorded α of layer 0, head 0, seq 0
    dyntool.list_runs("runs")
    with dyntool.Capture(model) as cap:                 # any supported model, see docs/recording.md
        loss.backward()
    cap.compute()                                       # name -> (layer, head, seq, ...) tensors
"""
from .version import __version__

__all__ = ["Run", "open_run", "list_runs", "Capture", "__version__"]


def __getattr__(name):
    # imported when asked for: the run API pulls in zarr (a second), Capture torch; every
    # `dyntool` command imports this package first, and a refused input should not wait for them
    if name in ("Run", "open_run", "list_runs"):
        from . import run           # deferred: keeps zarr off `import dyntool`
        return getattr(run, name)
    if name == "Capture":
        from .capture import Capture  # deferred: keeps torch off `import dyntool`
        return Capture
    raise AttributeError(f"module 'dyntool' has no attribute {name!r}")
