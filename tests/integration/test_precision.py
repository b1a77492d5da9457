"""What reaches disk keeps small score gradients: a tiny Llama's probe (loss scaled down so that
∂L/∂S sits where a real LM's does, ~1e-5 and below) recorded through RunRecorder, read back, and
compared with the same step computed in float64 by Capture."""
import numpy as np
import pytest
import torch
import zarr

pytest.importorskip("transformers", reason="transformers not installed (pip install dyntool[hf])")

from dyntool.capture import Capture  # noqa: E402
from dyntool.cli import main  # noqa: E402
from dyntool.integrations import RunRecorder  # noqa: E402
from tests.adapters.hf_reference import make_inputs, tiny_config  # noqa: E402

SCALE = 1e-4                                   # puts the median |∂L/∂S| near 1e-6


def _setup():
    torch.manual_seed(0)
    cls, cfg = tiny_config("llama")
    model = cls.from_config(cfg).eval()
    probe = make_inputs("llama")
    return model, probe, (lambda m, b: m(**b).loss * SCALE)


def _record(tmp_path, **kw):
    model, probe, loss_fn = _setup()
    with RunRecorder(model, tmp_path, max_steps=1, every=1, probe=probe, loss_fn=loss_fn, **kw) as rec:
        rec.probe_step(0)
        rec.log(0, loss=1.0)
    stored = np.asarray(zarr.open_group(str(rec.path / "record.zarr"), mode="r")["score_grad"][0], dtype=np.float64)
    model64 = model.double()
    with Capture(model64, seqs=1) as cap:
        loss_fn(model64, probe).backward()
    return rec.path, stored, cap.compute()["score_grad"].numpy()


def test_default_storage_keeps_small_score_gradients(tmp_path):
    path, stored, exact = _record(tmp_path)
    nz = exact != 0
    assert np.median(np.abs(exact[nz])) < 6.1e-5                  # below float16's normal range
    assert not (nz & (stored == 0)).any()                          # none flushed to zero
    row_max = np.abs(exact).max(-1, keepdims=True)
    big = (np.abs(exact) >= 1e-3 * row_max) & nz          # (a one-key row has ∂L/∂S = 0)
    rel = np.abs(stored - exact)[big] / np.abs(exact)[big]
    assert rel.max() <= 1e-3, rel.max()


def test_float16_gradients_lose_them_and_check_says_so(tmp_path, capsys):
    path, stored, exact = _record(tmp_path, grad_dtype="float16")
    assert ((exact != 0) & (stored == 0)).any()                    # the failure mode is real
    assert main(["check", str(path)]) == 0                         # readable: a note, not a problem
    out = capsys.readouterr().out
    assert "note: score_grad stored as float16" in out and "underflow" in out


@pytest.mark.parametrize("arrays", [None, ["attn", "score_grad", "upstream"], ["attn", "score_grad"]],
                         ids=["with_B", "U_only", "alpha_only"])
def test_exact_zeros_of_a_causal_lm_are_no_alarm(tmp_path, capsys, arrays):
    """The last position of a causal LM carries no loss (U = 0: its ∂L/∂S row is exactly 0) and the
    first sees one key (α = 1): float32 keeps every nonzero gradient, so `check` says nothing.
    Was: "score_grad stored as float32: … exactly 0 on disk (underflow); record with
    record.grad_dtype=float32" (the setting the run already had)."""
    path, stored, exact = _record(tmp_path, **({"arrays": arrays} if arrays else {}))
    assert (stored[..., -1, :] == 0).all() and (stored[..., 0, :] == 0).all()   # the exact zeros exist
    assert not ((exact != 0) & (stored == 0)).any()
    assert main(["check", str(path)]) == 0
    out = capsys.readouterr().out
    assert "note" not in out and "underflow" not in out, out
