"""Every tensor the recording code creates is created on the device of the tensors it meets.

A factory without ``device=`` makes a CPU tensor; on a GPU the next in-place op with a captured
tensor fails (``Expected all tensors to be on the same device``), which no CPU run can show: the
streamed full tier failed so on the first GPU session.  This scan fails on such a call in the
modules that compute recorded quantities; ``tests/gpu`` checks the same on a real device."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "dyntool"
KERNELS = ["stream.py", "cheap_stats.py", "capture.py", "quantities.py", "flight.py", "selfcheck.py",
           "observe.py", "masks.py", "span.py", "train/recording.py", "train/sharded.py",
           *(str(p.relative_to(PKG)) for p in sorted((PKG / "integrations").glob("*.py")))]
FACTORIES = {"zeros", "ones", "full", "empty", "arange", "tensor", "eye", "linspace"}


def unplaced(path: Path, root: Path = PKG.parent) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr in FACTORIES and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"):
            continue
        if any(kw.arg == "device" or kw.arg is None for kw in node.keywords):   # device= or **kwargs
            continue
        out.append(f"{path.relative_to(root)}:{node.lineno}: torch.{node.func.attr}(...) without device=")
    return out


@pytest.mark.parametrize("module", KERNELS)
def test_recording_code_places_every_new_tensor(module):
    path = PKG / module
    assert path.is_file(), module
    assert unplaced(path) == []


def test_the_scan_finds_a_cpu_tensor(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nx = torch.zeros(3, dtype=torch.float32)\ny = torch.ones(2, device=x.device)\n"
                   "z = torch.full((2,), 1.0, **{'device': 'cpu'})\n")
    got = [s.split(": ", 1)[1] for s in unplaced(bad, tmp_path)]
    assert got == ["torch.zeros(...) without device="]

