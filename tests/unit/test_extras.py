"""Every optional path names its extra in one line (exit 2 on the command line) when its package is
missing.  Each package is hidden (``sys.modules[name] = None`` makes ``import name`` raise), so these
run whether or not the extra is installed here."""
from __future__ import annotations

import math
import sys

import numpy as np
import pytest
import torch

from dyntool.cli import main
from dyntool.errors import DyntoolError
from dyntool.extras import EXTRAS, MissingExtra, hint, need
from dyntool.run import open_run
from dyntool.run_writer import RunWriter


def hide(monkeypatch, *names):
    """Make ``import name`` (and of its submodules) fail; forget dyntool modules that hold it."""
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            monkeypatch.delitem(sys.modules, loaded)
        monkeypatch.setitem(sys.modules, name, None)
    for mod in ("dyntool.integrations.hf", "dyntool.integrations.lightning"):
        monkeypatch.delitem(sys.modules, mod, raising=False)


@pytest.fixture
def run(tmp_path):
    with RunWriter.create(tmp_path, "test", {}, name="r") as w:
        st = w.open_store(chunk_steps=2)
        for s in (0, 1):
            st.append(s, {"logit_max": np.ones((1, 1), np.float32)})
            w.log(s, loss=1.0, recorded=True)
    return open_run(tmp_path / "r")


def one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in err and "internal error" not in err, err
    return err


def test_hint_names_the_extra_and_every_extra_exists():
    import tomllib
    from pathlib import Path
    extras = set(tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
                 ["project"]["optional-dependencies"])
    assert set(EXTRAS.values()) <= extras and "wandb" in extras
    assert hint("dask.array", "x") == "x: dask is not installed; pip install 'dyntool[scale]'"
    assert hint("transformer_lens") == "transformer_lens is not installed; pip install 'dyntool[tl]'"
    assert hint("somethingelse") == "somethingelse is not installed; pip install somethingelse"


def test_need_is_an_import_error_and_a_dyntool_error(monkeypatch):
    hide(monkeypatch, "obstore")
    with pytest.raises(MissingExtra) as e:
        need("obstore")
    assert isinstance(e.value, ImportError) and isinstance(e.value, DyntoolError)
    assert "dyntool[scale]" in str(e.value)


@pytest.mark.parametrize("argv", [["sim", "toy", "--out", "s3://bucket/runs"],
                                  ["train", "--out", "s3://bucket/runs", "--name", "r1"]])
def test_s3_without_obstore_names_the_scale_extra(argv, monkeypatch, tmp_path, capsys):
    """Was: ``internal error: ModuleNotFoundError: No module named 'obstore'``."""
    hide(monkeypatch, "obstore")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert one_line(capsys) == "dyntool: error: s3:// runs: obstore is not installed; pip install 'dyntool[scale]'"
    assert list(tmp_path.iterdir()) == []          # nothing written, no local 's3:' folder


def test_wandb_names_its_extra(run, monkeypatch, capsys):
    hide(monkeypatch, "wandb")
    assert main(["export", str(run.path), "--to-wandb", "proj"]) == 2
    assert "pip install 'dyntool[wandb]'" in one_line(capsys)


def test_tensorboard_names_its_extra(run, monkeypatch, tmp_path, capsys):
    hide(monkeypatch, "tensorboard")
    assert main(["export", str(run.path), "--to-tensorboard", str(tmp_path / "tb")]) == 2
    assert "tensorboard is not installed; pip install 'dyntool[tensorboard]'" in one_line(capsys)
    assert not (tmp_path / "tb").exists()


def test_xarray_names_the_export_extra(run, monkeypatch, tmp_path, capsys):
    hide(monkeypatch, "xarray")
    assert main(["export", str(run.path), "--to", str(tmp_path / "x"), "--format", "netcdf"]) == 2
    assert "xarray is not installed; pip install 'dyntool[export]'" in one_line(capsys)


def test_dask_names_the_scale_extra(monkeypatch):
    from dyntool import scale
    hide(monkeypatch, "dask")
    with pytest.raises(DyntoolError, match=r"dask is not installed; pip install 'dyntool\[scale\]'"):
        scale.need_dask()


def test_hub_names_the_data_extra(monkeypatch):
    from dyntool.data import sources
    hide(monkeypatch, "huggingface_hub")
    with pytest.raises(DyntoolError, match=r"dyntool\[data\]"):
        sources.hub_source("hf:Salesforce/wikitext")


def test_transformers_names_the_hf_extra(monkeypatch):
    hide(monkeypatch, "transformers")
    with pytest.raises(MissingExtra, match=r"HFRecorderCallback: transformers is not installed; "
                                           r"pip install 'dyntool\[hf\]'"):
        from dyntool.integrations import HFRecorderCallback  # noqa: F401


def test_lightning_names_its_extra(monkeypatch):
    hide(monkeypatch, "lightning", "pytorch_lightning")
    with pytest.raises(MissingExtra, match=r"LightningRecorder: lightning is not installed; "
                                           r"pip install 'dyntool\[lightning\]'"):
        from dyntool.integrations import LightningRecorder  # noqa: F401


def test_triton_names_the_kernels_extra(monkeypatch):
    import importlib.util

    from dyntool import kernels
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "triton" else real(n, *a))
    assert kernels.unavailable("cpu") == "triton is not installed; pip install 'dyntool[kernels]'"


def test_an_error_inside_an_installed_package_is_not_blamed_on_the_extra(monkeypatch, tmp_path):
    """A package that is there but fails to import names what failed, not ``pip install``."""
    (tmp_path / "brokenpkg_for_extras.py").write_text("import not_a_real_module_for_extras\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(MissingExtra) as e:
        need("brokenpkg_for_extras")
    assert "importing brokenpkg_for_extras failed" in str(e.value) and "pip install" not in str(e.value)



@pytest.fixture
def no_triton(monkeypatch):
    """A core install: Triton absent, dyntool.kernels' Triton modules never imported."""
    import dyntool.kernels as kernels
    hide(monkeypatch, "triton")
    for sub in ("stats", "backward", "forward", "op", "tiles"):
        monkeypatch.delitem(sys.modules, f"dyntool.kernels.{sub}", raising=False)
        monkeypatch.delattr(kernels, sub, raising=False)


def test_cheap_tier_records_without_triton(no_triton, tmp_path, capsys):
    """Was: on a core install every cheap-tier recording (the README's ``sim icl-markov``, ``train
    --record.cheap_every=1``) stopped with ``internal error: ModuleNotFoundError: No module named
    'triton'``: the eager path imported the fused kernel's reduction."""
    from dyntool.flight import FlightRecorder
    from dyntool.kernels import unavailable
    from dyntool.record import metric_names as mn
    from dyntool.train.config import ModelConfig
    from dyntool.train.gpt import GPT
    from tests.integration.test_train import rows, train
    assert unavailable("cpu") == "triton is not installed; pip install 'dyntool[kernels]'"
    torch.manual_seed(0)
    m = GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16), 20, 8)
    x = torch.randint(0, 20, (2, 8))
    flight = FlightRecorder(m)
    with flight:
        m(x, x)[1].backward()
    ent = flight.result()["attn_entropy"]
    assert ent.shape == (1, 2) and bool(((ent > 0) & (ent <= math.log(8))).all())
    quick = ("--max-steps", "1", "--record.cheap_every=1", "--train.final_eval=off", "--train.eval_every=0")
    rc, path = train(tmp_path, *quick)
    assert rc == 0 and mn.head("attn_entropy", 0, 0) in rows(path)[0]
    rc, path = train(tmp_path, *quick, "--record.kernel=fused", name="fused")
    assert rc == 2 and not path.exists()
    assert "pip install 'dyntool[kernels]'" in one_line(capsys)
