"""The ls-logits study's tables and presets (the runs themselves are exercised by the CPU preset)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dyntool.errors import ConfigError
from dyntool.train import ls_logits as L


def _frame():
    rng = np.random.default_rng(0)
    steps = np.arange(6)
    df = pd.DataFrame({"step": steps, "loss": rng.random(6)})
    for l in range(2):
        for h in range(3):
            df[f"logit_max/L{l}H{h}"] = 1 + l + h * steps + rng.random(6) * 0.1
        df[f"logit_max/L{l}"] = df[[f"logit_max/L{l}H{h}" for h in range(3)]].max(axis=1)
    df.loc[2, "logit_max/L1H0"] = np.nan                   # a step without the statistic
    return df


def test_head_table_marks_local_and_global_and_matches_the_columns():
    df = _frame()
    rows = L.head_table(df, n_local=2, is_ls=True)
    assert [(r["layer"], r["head"], r["type"]) for r in rows] == [
        (0, 0, "local"), (0, 1, "local"), (0, 2, "global"), (1, 0, "local"), (1, 1, "local"), (1, 2, "global")]
    for r in rows:
        col = df[f"logit_max/L{r['layer']}H{r['head']}"].dropna()
        assert r["first"] == col.iloc[0] and r["last"] == col.iloc[-1] and r["peak"] == col.max()
        assert r["peak_step"] == int(df.loc[col.idxmax(), "step"])
    assert all(r["type"] == "global" for r in L.head_table(df, n_local=2, is_ls=False))


def test_layer_table_separates_local_and_global_peaks():
    df = _frame()
    lay = L.layer_table(L.head_table(df, n_local=2, is_ls=True))
    for l, row in enumerate(lay):
        loc = max(df[f"logit_max/L{l}H{h}"].max() for h in (0, 1))
        assert row["local_peak"] == loc and row["global_peak"] == df[f"logit_max/L{l}H2"].max()


def test_presets_and_arms():
    assert L.presets_for("cpu")[0] == ["cpu"] and L.presets_for("small")[0] == ["cpu"]
    ps, arms = L.presets_for("gpu")
    assert ps == ["gpu512", "gpu1024", "gpu2048"] and "mhsa-eager-fp32" in arms
    with pytest.raises(ConfigError, match="ls-logits presets"):
        L.presets_for("huge")


@pytest.mark.parametrize("preset,T", [("cpu", 512), ("gpu512", 512), ("gpu1024", 1024), ("gpu2048", 2048)])
def test_presets_are_in_the_papers_regime(preset, T):
    from dyntool import config
    from dyntool.train.config import TrainConfig
    cfg = config.load(TrainConfig, L.CONFIG, preset, [])     # no device check: gpu presets load on CPU
    m = cfg.model
    hd = m.n_embd // m.n_head
    assert cfg.data.block_size == T and (m.n_local, m.n_global, m.window) == (5, 1, 50)
    assert cfg.data.block_size / hd == (64 if preset in ("cpu", "gpu2048") else T / 32)
    assert hd == (8 if preset == "cpu" else 32)
    assert cfg.optim.lr == 6e-4 and cfg.optim.min_lr_ratio == 1.0 and not m.tie_weights
    if preset != "cpu":
        assert cfg.data.batch_size * T == 32768
