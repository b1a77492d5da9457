"""dyntool.sims.device.resolve: the sims' device key (issue 34) without a GPU (CUDA faked)."""
import pytest
import torch

from dyntool import config
from dyntool.errors import ConfigError
from dyntool.sims.bijection import BijectionConfig
from dyntool.sims.device import resolve


@pytest.mark.parametrize("name", ["auto", "mps", "gpu", "cuda:", "cuda:x", "CPU", "", None])
def test_names_other_than_cpu_cuda_and_cuda_n_are_refused(name):
    with pytest.raises(ConfigError, match="cpu, cuda or cuda:N"):
        resolve(name)


def test_the_config_key_is_checked_on_loading():
    assert config.load(BijectionConfig, "bijection.toml", "ci", ["--device=cuda:3"]).device == "cuda:3"
    with pytest.raises(ConfigError, match="device"):
        config.load(BijectionConfig, "bijection.toml", "ci", ["--device=mps"])


def test_cpu_is_the_cpu_and_cuda_needs_a_visible_device(monkeypatch):
    assert resolve("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for name in ("cuda", "cuda:0"):
        with pytest.raises(ConfigError, match="no CUDA GPU is visible"):
            resolve(name)


def test_cuda_resolves_to_an_index_this_machine_has(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert resolve("cuda") == torch.device("cuda", 1)            # meta.json names the index
    assert resolve("cuda:0") == torch.device("cuda", 0)
    with pytest.raises(ConfigError, match="2 CUDA device"):
        resolve("cuda:2")
