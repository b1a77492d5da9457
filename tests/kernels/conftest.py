"""The fused kernels run on the CPU under Triton's interpreter here.  Triton reads
``TRITON_INTERPRET`` when it is imported (its own library functions) and when a kernel is
defined, so tests/conftest.py sets it before anything imports triton.  On a machine with CUDA
this folder is skipped instead: the variable would also turn torch.compile's own Triton kernels
into interpreted ones, and tests/gpu runs the kernels compiled there."""
import os

import pytest
import torch

if torch.cuda.is_available():
    collect_ignore_glob = ["test_*.py"]
else:
    os.environ["TRITON_INTERPRET"] = "1"        # already set by tests/conftest.py
    pytest.importorskip("triton")
