import pytest

from dyntool import config
from dyntool.errors import ConfigError
from dyntool.sims.toy import ToyConfig


def test_defaults_and_overrides():
    cfg = config.load(ToyConfig, overrides=["--model.T=4", "--model.labels=0,1,1,2", "--lr=0.1",
                                            "--model.causal=true", "--record.every=2"])
    assert (cfg.model.T, cfg.model.labels, cfg.lr, cfg.model.causal, cfg.record.every) == \
        (4, [0, 1, 1, 2], 0.1, True, 2)


def test_toml_and_preset(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('steps = 7\n[model]\nd_k = 3\n[preset.fast]\nsteps = 2\n[preset.fast.model]\nd_v = 4\n')
    cfg = config.load(ToyConfig, f, preset="fast", overrides=["--model.d_k=5"])
    assert (cfg.steps, cfg.model.d_k, cfg.model.d_v) == (2, 5, 4)
    with pytest.raises(ConfigError, match="--preset"):
        config.load(ToyConfig, f, preset="nope")


@pytest.mark.parametrize("override,key", [
    (["--model.foo=1"], "model.foo"),
    (["--steps=abc"], "steps"),
    (["--steps=1.5"], "steps"),
    (["--model.causal=maybe"], "model.causal"),
    (["--record.dtype=int8"], "record.dtype"),
    (["--record.arrays=attn,nonsense"], "record.arrays"),
    (["--model=3"], "model"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError) as e:
        config.load(ToyConfig, overrides=override)
    assert e.value.key == key
    assert key in str(e.value) and "\n" not in str(e.value)


def test_bad_toml_file(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text("steps = = 3")
    with pytest.raises(ConfigError, match="not valid TOML"):
        config.load(ToyConfig, f)
    with pytest.raises(ConfigError, match="no such file"):
        config.load(ToyConfig, tmp_path / "missing.toml")
