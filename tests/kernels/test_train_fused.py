"""``dyntool train --record.kernel=...`` and ``RunRecorder(kernel=...)``: the path map lands in the
run's meta; fused (under the interpreter) writes the same cheap statistics as eager; a fused
request that cannot be served is one line and exit 2, with no run folder left behind."""
from __future__ import annotations

import json

import torch

from dyntool.cli import main
from dyntool.record import metric_names as mn
from tests.integration.test_train import rows, train


def test_train_fused_equals_eager(tmp_path, capsys):
    common = ("--max-steps", "2", "--record.every=0", "--record.cheap_every=1", "--train.final_eval=off",
              "--train.eval_every=0", "--model.backend=sdpa")
    rc, fused = train(tmp_path, *common, "--record.kernel=fused", name="fused")
    assert rc == 0
    rc, eager = train(tmp_path, *common, "--record.kernel=eager", name="eager")
    assert rc == 0
    meta = json.loads((fused / "meta.json").read_text())
    assert meta["attention_paths"] == {"L0": "fused", "L1": "fused"}
    assert json.loads((eager / "meta.json").read_text())["attention_paths"]["L0"] == "eager: record.kernel=eager"
    for run, says in ((fused, "paths    fused: L0, L1"), (eager, "paths    eager: record.kernel=eager: L0, L1")):
        assert main(["info", str(run)]) == 0                   # `dyntool info` names each site's path
        assert says in capsys.readouterr().out
    a, b = rows(fused), rows(eager)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1]
    for ra, rb in zip(a, b):
        for name in ("attn_entropy", "score_grad_norm", "value_grad_norm", "column_entropy", "compat_var"):
            x = torch.tensor([ra[mn.head(name, l, h)] for l in range(2) for h in range(2)], dtype=torch.float64)
            y = torch.tensor([rb[mn.head(name, l, h)] for l in range(2) for h in range(2)], dtype=torch.float64)
            assert float((x - y).norm() / y.norm()) <= 1e-4, name     # two fp32 trainings, 2 steps apart


def test_train_fused_refused_in_one_line(tmp_path, capsys):
    rc, path = train(tmp_path, "--max-steps", "1", "--record.cheap_every=1", "--record.kernel=fused",
                     "--model.attention=span")
    assert rc == 2 and not path.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["dyntool: error: config error: record.kernel: fused: L0: span keeps its own backward"]
    assert main(["train", "--config", "wikitext_mhsa", "--record.kernel=fast", "--out", str(tmp_path)]) == 2
    assert "record.kernel" in capsys.readouterr().err


def test_run_recorder_kernel_option(tmp_path):
    """RunRecorder(kernel="fused") (the callbacks pass the same keyword): the path map in meta,
    and two micro-steps at grad_scale 0.5 give the statistics of the eager recorder."""
    from dyntool.integrations.loop import RunRecorder
    from tests.kernels.test_flight_fused import V, gpt
    m = gpt()
    x, y = torch.randint(0, V, (2, 20)), torch.randint(0, V, (2, 20))
    got = {}
    for kernel in ("fused", "eager"):
        with RunRecorder(m, tmp_path, max_steps=1, every=0, batch="train", cheap_every=1, kernel=kernel,
                         name=kernel) as rec:
            for micro in range(2):
                with rec.train_step(0, grad_scale=0.5):
                    (0.5 * m(x, y)[1]).backward()
            m.zero_grad()
            rec.log(0, loss=1.0)
        got[kernel] = rows(rec.path)[0]
        paths = json.loads((rec.path / "meta.json").read_text())["attention_paths"]
        assert set(paths) == {"L0", "L1"} and paths["L0"].startswith(kernel)
    for key, val in got["eager"].items():
        if "/L" in key:
            assert abs(got["fused"][key] - val) <= 1e-5 * max(1.0, abs(val)), key


def _compiling(monkeypatch, graphs: list):
    """``train.compile`` with aot_eager (no C++ toolchain, the interpreter's launches run as they
    are) and ``fullgraph=True``, so a graph break fails the test; ``graphs`` counts compilations."""
    inner = torch._dynamo.lookup_backend("aot_eager")

    def counting(gm, example_inputs):
        graphs.append(gm)
        return inner(gm, example_inputs)
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, fullgraph=True, backend=counting))


def test_compiled_steps_record_through_the_kernel(tmp_path, monkeypatch):
    """``train.compile`` with the cheap tier every 2nd step: recorded steps stay compiled (one
    graph with the kernel and its statistics, one without, one for the logits-only steps), and
    every row has the same statistics as an uncompiled run, the max |logit| of every step included
    (from the kernel's forward on the steps without the cheap tier)."""
    common = ("--max-steps", "4", "--record.every=0", "--record.cheap_every=2", "--train.final_eval=off",
              "--train.eval_every=0", "--model.backend=sdpa", "--record.kernel=fused")
    rc, plain = train(tmp_path, *common, name="plain")
    assert rc == 0
    graphs: list = []
    _compiling(monkeypatch, graphs)
    rc, comp = train(tmp_path, *common, "--train.compile=true", name="compiled")
    assert rc == 0
    torch._dynamo.reset()
    # two graphs, both through the kernel: the cheap tier's (token in, statistics out) and the
    # logits-only one; none per step
    assert len(graphs) == 2 and all("dyntool.attn_fwd" in g.code for g in graphs)
    assert sum("token" in g.code for g in graphs) == 1, [g.code for g in graphs]
    meta = json.loads((comp / "meta.json").read_text())
    assert meta["compiled_steps"] == {"cheap_tier": "compiled, fused kernel",
                                      "logit_stat": "exact, fused kernel's forward statistics"}
    a, b = rows(comp), rows(plain)
    assert [r["step"] for r in a] == [r["step"] for r in b] == [0, 1, 2, 3]
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        assert mn.head(mn.LOGIT_MAX, 1, 1) in ra and (mn.head("column_entropy", 0, 0) in ra) == (ra["step"] % 2 == 0)
        for key, val in rb.items():
            if key.split("/")[0] in mn.CHEAP_TIER or key.startswith("logit_max") or key in ("loss", "grad_norm"):
                assert abs(ra[key] - val) <= 1e-4 * max(1.0, abs(val)), key


def test_compiled_logit_stat_without_the_kernel(tmp_path, monkeypatch):
    """record.kernel=eager: a compiled step's max |logit| comes from the q, k the graph hands out
    (it used to be silently absent), equal to the uncompiled run's."""
    common = ("--max-steps", "3", "--record.every=0", "--record.cheap_every=0", "--train.final_eval=off",
              "--train.eval_every=0", "--record.kernel=eager")
    rc, plain = train(tmp_path, *common, name="plain")
    assert rc == 0
    graphs: list = []
    _compiling(monkeypatch, graphs)
    for stat in ("exact", "bound"):
        rc, comp = train(tmp_path, *common, "--train.compile=true", f"--train.logit_stat={stat}", name=stat)
        assert rc == 0
        torch._dynamo.reset()
        assert json.loads((comp / "meta.json").read_text())["compiled_steps"] == {
            "logit_stat": f"{stat}, from the q, k the compiled graph returns"}
        for ra, rb in zip(rows(comp), rows(plain)):
            assert mn.LOGIT_MAX in ra
            if stat == "exact":
                assert abs(ra[mn.LOGIT_MAX] - rb[mn.LOGIT_MAX]) <= 1e-5 * rb[mn.LOGIT_MAX]
            else:
                assert ra[mn.LOGIT_MAX] >= rb[mn.LOGIT_MAX] * (1 - 1e-6)      # an upper bound
    assert graphs
