"""Fixtures shared by test modules."""
import pytest
import torch


@pytest.fixture
def float64_default():
    """float64 as torch's default dtype for one test, restored afterwards (a global default would
    leak into other files).  A module opts in with ``pytestmark = pytest.mark.usefixtures("float64_default")``."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)
