"""dyntool: record and explore the gradient dynamics of attention.

Public API::

    import dyntool
    run = dyntool.open_run("runs/sticky/seed42-em")   # config, meta, metrics (DataFrame), lazy arrays
    run.arrays["attn"][-1, 0, 0, 0]                     # last recorded α of layer 0, head 0, seq 0
    dyntool.list_runs("runs")
"""
__version__ = "0.1.0"

from .run import Run, list_runs, open_run  # noqa: E402

__all__ = ["Run", "open_run", "list_runs", "__version__"]
