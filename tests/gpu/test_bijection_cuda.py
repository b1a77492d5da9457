"""The wind tunnel on a CUDA device (issue 46; skipped without a GPU, run by a lent session's
``pytest tests/gpu``): the step compiled and replayed as CUDA graphs equals the eager step on the
GPU, and a CUDA run stopped at a step budget resumes where it stopped (the CUDA generator's state is
saved; compared to float rounding, since CUDA's embedding and attention backward kernels may add in
any order)."""
from __future__ import annotations

import json

import pytest
import torch

from dyntool.cli import main
from tests.unit.test_bijection_step import STEPS, _run

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

BIJ = ["sim", "bijection", "--config", "bijection", "--preset", "ci", "--quiet", "--device=cuda"]


def test_the_cuda_graph_step_equals_the_eager_step_on_the_gpu():
    from dyntool import config
    from dyntool.sims.bijection import BijectionConfig, build_model
    cfg = config.load(BijectionConfig, "bijection", "paper", values={"device": "cuda"})
    model = build_model(cfg).cuda()
    torch._dynamo.reset()
    g = torch.Generator(device="cuda")
    e_loss, e_norm, e_params = _run(cfg, model, compiled=False, gen=g)
    c_loss, c_norm, c_params = _run(cfg, model, compiled=True, gen=g)
    assert e_loss == pytest.approx(c_loss, rel=1e-4) and e_norm == pytest.approx(c_norm, rel=1e-3)
    assert len(set(e_loss)) == STEPS
    for k, v in e_params.items():
        torch.testing.assert_close(c_params[k], v, rtol=1e-4, atol=1e-5, msg=k)


@pytest.mark.parametrize("compile_", ["off", "on"])
def test_a_cuda_run_resumes_where_it_stopped(tmp_path, compile_):
    flag = f"--compile={compile_}"
    assert main(BIJ + [flag, "--out", str(tmp_path), "--name", "whole"]) == 0
    assert main(BIJ + [flag, "--out", str(tmp_path), "--name", "cut", "--stop_at_step=5"]) == 0
    assert main(["sim", "bijection", "--quiet", "--resume", str(tmp_path / "cut")]) == 0

    def rows(run, since):
        return [json.loads(line) for line in (tmp_path / run / "metrics.jsonl").read_text().splitlines()
                if json.loads(line)["step"] >= since]
    got, want = rows("cut-resume5", 5), rows("whole", 5)
    assert [r["step"] for r in got] == [r["step"] for r in want] and len(got) >= 3
    for g, w in zip(got, want):
        assert g.keys() == w.keys()
        if "loss" in w:
            assert g["loss"] == pytest.approx(w["loss"], rel=1e-4)
    a = torch.load(tmp_path / "whole" / "checkpoint.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "cut-resume5" / "checkpoint.pt", weights_only=True)["model"]
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-4, atol=1e-5, msg=k)
