"""bench/gpu_check.py in CPU mode: argument errors, and the parity section as a smoke run."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_unknown_section_is_a_one_line_error_exit_2(capsys):
    assert _load().main(["--only", "parity,nonsense"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "nonsense" in err[0]


def test_flops_per_token_is_nanogpts_count():
    from dyntool.train.config import TrainConfig
    cfg = TrainConfig()
    cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, cfg.data.block_size = 2, 4, 64, 32
    assert _load().flops_per_token(cfg, 1000) == 6 * 1000 + 12 * 2 * 4 * 16 * 32


@pytest.mark.slow
def test_cpu_parity_section_runs_and_passes(tmp_path):
    out = tmp_path / "gc.json"
    assert _load().main(["--only", "parity", "--quick", "--json", str(out)]) == 0
    res = json.loads(out.read_text())["results"]
    assert {r["status"] for r in res} <= {"PASS", "SKIP"}
    flex = [r for r in res if "/flex/" in r["name"]]
    assert len(flex) == 8 and all(r["status"] == "PASS" and "rel_err_out" in r for r in flex)
    sdpa_bf16 = next(r for r in res if r["name"] == "ls/sdpa/bfloat16/eager")
    assert 1e-4 < sdpa_bf16["rel_err_dq"] < 3e-2         # bf16 really ran (not float32 again)
