"""One meaning for "steps": the optimizer steps a run has taken.

A metrics row (and a recorded row) with ``step = s`` describes the model after ``s`` optimizer
steps, i.e. before update ``s``.  Runs differ only in whether the last state is logged too:

- training (``dyntool train``), the toy head, the wind tunnel, the integrations: row ``s`` is
  logged and then update ``s`` is applied, so rows ``0 … N-1`` mean **N steps taken**; training's
  validation of the model after ``s`` steps is in row ``s`` too (``best_val_step`` = s), and the
  one after the last step is a row ``N`` of its own (``val_loss``, no ``loss``);
- the sticky Markov-chain study also logs the state after its last update: rows ``0 … N``
  (step 0 = the initial state, recorded) mean **N steps taken**.

Finished runs say it in ``meta.json``: ``final.steps`` (training, simulations) or
``final.steps_done`` (the wind tunnel, which may stop early); runs that log the final state carry
``"metrics_rows": "states 0..N"``.  ``dyntool ls``, ``dyntool info``, the app and
``docs/FORMAT.md`` all use :func:`steps_taken`.
"""
from __future__ import annotations

STATE_ROWS = "states 0..N"                 # meta["metrics_rows"]: the state after the last step is logged
_STATE_KINDS = ("sticky-markov",)          # runs written before the meta key existed


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def logs_final_state(meta: dict) -> bool:
    return meta.get("metrics_rows") == STATE_ROWS or \
        ("metrics_rows" not in meta and meta.get("kind") in _STATE_KINDS)


def steps_taken(meta: dict, metrics) -> int:
    """Optimizer steps taken: ``meta.final`` when the run says it, else from the last metrics row."""
    final = meta.get("final") if isinstance(meta.get("final"), dict) else {}
    for key in ("steps", "steps_done"):
        if _int(final.get(key)) is not None:
            return final[key]
    if metrics is None or "step" not in metrics or not len(metrics):
        return 0
    last = int(metrics["step"].max())
    return last if logs_final_state(meta) or _state_row(metrics, last) else last + 1


def _state_row(metrics, last: int) -> bool:
    """Training writes the validation after its last step as a row of its own (no training
    ``loss``): row N then describes the state after N steps, not an update."""
    if "loss" not in metrics or "val_loss" not in metrics:
        return False
    rows = metrics[metrics["step"] == last]
    return bool(rows["loss"].isna().all() and rows["val_loss"].notna().any())
