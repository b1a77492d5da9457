"""The fused kernels run on the CPU under Triton's interpreter here.  Triton reads
``TRITON_INTERPRET`` when a kernel is *defined*, so it is set before any test module of this
folder imports ``dyntool.kernels`` (tests/gpu runs them compiled)."""
import os

import pytest

os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
