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


# -- the validation layer: bounds on annotations, finite floats, seeds, devices ------------------

@pytest.mark.parametrize("cls,override,key", [
    ("toy", "--lr=1e400", "lr"),                     # parses as inf
    ("toy", "--lr=-inf", "lr"),
    ("toy", "--lr=nan", "lr"),
    ("toy", "--model.d_k=0", "model.d_k"),
    ("toy", "--model.init_std=-1", "model.init_std"),
    ("toy", "--seed=-1", "seed"),
    ("toy", "--seed=4294967296", "seed"),            # one past np.random.seed's range
    ("toy", "--seed=1e30", "seed"),
    ("toy", "--seed=inf", "seed"),
    ("sticky", "--n_symbols=0", "n_symbols"),
    ("sticky", "--d_v=-2", "d_v"),
    ("sticky", "--seeds=1,1e25", "seeds"),
    ("sticky", "--embed_seed=-5", "embed_seed"),
    ("train", "--device=bogus", "device"),
    ("train", "--device=cuda:x", "device"),
    ("train", "--train.threads=-1", "train.threads"),
    ("train", "--train.max_steps=0", "train.max_steps"),
    ("train", "--optim.beta1=-0.1", "optim.beta1"),
    ("train", "--span.eps=2", "span"),               # SpanConfig checks itself; reported as config
    ("train", "--span.impl=fast", "span"),
])
def test_bounds_finite_and_ranges_name_the_key(cls, override, key):
    from dyntool.sims.sticky import StickyConfig
    from dyntool.train.config import TrainConfig
    schema = {"toy": ToyConfig, "sticky": StickyConfig, "train": TrainConfig}[cls]
    with pytest.raises(ConfigError) as e:
        config.load(schema, overrides=[override])
    assert e.value.key == key and "\n" not in str(e.value)


def test_bounds_accept_the_edges():
    from dyntool.train.config import TrainConfig
    cfg = config.load(ToyConfig, overrides=["--seed=4294967295", "--model.init_std=0", "--model.d_k=1"])
    assert (cfg.seed, cfg.model.init_std, cfg.model.d_k) == (2**32 - 1, 0.0, 1)
    cfg = config.load(TrainConfig, overrides=["--device=cuda:1", "--train.threads=0", "--seed=1e3"])
    assert (cfg.device, cfg.train.threads, cfg.seed) == ("cuda:1", 0, 1000)
    assert config.load(ToyConfig, overrides=["--steps=12345678901"]).steps == 12345678901   # exact


def test_range_and_pattern_are_generic():
    from typing import Annotated, Optional
    from dataclasses import dataclass

    @dataclass
    class S:
        a: Annotated[float, config.Range(0, 1, lo_open=True)] = 0.5
        b: Optional[config.PosInt] = None
        c: list[config.Seed] = None

    assert config.load(S, values={"a": 1, "b": None, "c": [0, 3]}).c == [0, 3]
    for bad in ({"a": 0}, {"a": 1.01}, {"b": 0}, {"c": [1, -1]}):
        with pytest.raises(ConfigError):
            config.load(S, values=bad)


def test_values_are_typed_and_win_over_string_overrides():
    cfg = config.load(ToyConfig, overrides=["--steps=7", "--model.d_k=3"],
                      values={"steps": 9, "model.d_v": 4})
    assert (cfg.steps, cfg.model.d_k, cfg.model.d_v) == (9, 3, 4)
    assert config.parse_value(ToyConfig, "model.labels", "0,1,1,2,2") == [0, 1, 1, 2, 2]
    with pytest.raises(ConfigError, match="unknown key"):
        config.key_type(ToyConfig, "model.nope")


def test_merge_and_base_are_public():
    assert config.merge({"a": {"x": 1, "y": 2}, "b": 1}, {"a": {"y": 3}}) == {"a": {"x": 1, "y": 3}, "b": 1}
    assert config.nest({"a.b": 1, "c": 2}) == {"a": {"b": 1}, "c": 2}
    base = config.to_dict(config.load(ToyConfig, overrides=["--steps=11"]))
    cfg = config.load(ToyConfig, base=base, overrides=["--lr=0.2"])
    assert (cfg.steps, cfg.lr) == (11, 0.2)


@pytest.mark.parametrize("name", ["toy", "toy.toml", "sims/toy.toml", "/nowhere/at/all/sims/toy.toml",
                                  "/nowhere/dyntool/presets/toy.toml"])
def test_packaged_presets_resolve_by_name_and_old_path(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                      # not the repository: no sims/ here
    assert config.resolve_file(name) == config.PRESETS / "toy.toml"
    assert config.load(ToyConfig, name, preset="slow").steps == 2000


def test_every_packaged_preset_loads():
    from dyntool.sims.bijection import BijectionConfig
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.sticky import StickyConfig
    from dyntool.train.config import TrainConfig
    files = sorted(config.PRESETS.glob("*.toml"))
    assert {f.stem for f in files} >= {"toy", "sticky_markov", "wikitext_mhsa", "wikitext_ls",
                                       "wikitext_span", "wikitext_qknorm"}
    for f in files:
        cls = {"toy": ToyConfig, "sticky_markov": StickyConfig, "bijection": BijectionConfig,
               "icl_markov": ICLMarkovConfig}.get(f.stem, TrainConfig)
        for preset in [None, *config.read_file(f).get("preset", {})]:
            config.load(cls, f, preset)
    with pytest.raises(ConfigError, match="packaged presets"):
        config.resolve_file("sims/nope.toml")


def test_unknown_key_suggests_the_closest(tmp_path):
    from dyntool.config import load
    from dyntool.errors import ConfigError
    from dyntool.train.config import TrainConfig
    with pytest.raises(ConfigError) as e:
        load(TrainConfig, overrides=["--data.pth=x"])
    msg = str(e.value)
    assert "did you mean data.path?" in msg and msg.index("did you mean") < msg.index("known:")
    with pytest.raises(ConfigError) as e:
        load(TrainConfig, overrides=["--zzzz.qqq=1"])
    assert "did you mean" not in str(e.value)


# -- renamed keys: one word per idea (crop, every), the old names still load ---------------------

def test_old_key_names_load_with_one_warning_line(tmp_path):
    from dyntool.sims.sticky import StickyConfig
    from dyntool.train.config import TrainConfig
    f = tmp_path / "old.toml"
    f.write_text("window = 30\n[record]\nquery_window = [5, 9]\n")
    with pytest.warns(config.DeprecatedKeyWarning) as w:
        cfg = config.load(StickyConfig, f, overrides=["--record.key_window=0,4"])
    assert (cfg.crop, cfg.record.query_crop, cfg.record.key_crop) == (30, [5, 9], [0, 4])
    assert len(w) == 3 and all("\n" not in str(x.message) and "deprecated" in str(x.message) for x in w)
    assert "record.query_window" in str(w[1].message) and "record.query_crop" in str(w[1].message)
    with pytest.warns(config.DeprecatedKeyWarning, match="train.eval_interval is deprecated, use train.eval_every"):
        t = config.load(TrainConfig, overrides=["--train.eval_interval=7", "--train.checkpoint_interval=3",
                                                "--train.log_interval=2"])
    assert (t.train.eval_every, t.train.checkpoint_every, t.train.log_every) == (7, 3, 2)
    d = config.to_dict(t)
    assert "eval_interval" not in d["train"] and "query_window" not in d["record"] and "query_crop" in d["record"]


def test_an_old_runs_config_json_loads_quietly(recwarn):
    """A recorded config.json (``base``: a resumed run) holds every key, the old names among them,
    one of a pair left unset: the set one wins, nothing is printed; a later layer's new key overrides."""
    from dyntool.train.config import TrainConfig
    old = config.to_dict(TrainConfig())
    old["train"] = {("eval_interval" if k == "eval_every" else k): v for k, v in old["train"].items()}
    old["train"]["eval_interval"] = 40
    old["record"].update(query_window=[2, 8], key_window=[])
    cfg = config.load(TrainConfig, base=old)
    assert cfg.train.eval_every == 40 and cfg.record.query_crop == [2, 8] and cfg.record.key_crop == []
    assert cfg.train.checkpoint_every == TrainConfig().train.checkpoint_every
    assert not [w for w in recwarn if issubclass(w.category, config.DeprecatedKeyWarning)]
    assert config.load(TrainConfig, base=old, overrides=["--train.eval_every=5"]).train.eval_every == 5


def test_old_and_new_name_set_differently_is_refused():
    from dyntool.train.config import TrainConfig
    with pytest.warns(config.DeprecatedKeyWarning), pytest.raises(ConfigError) as e:
        config.load(TrainConfig, overrides=["--record.query_window=0,4", "--record.query_crop=1,5"])
    assert e.value.key == "record.query_crop" and "older name" in str(e.value)


def test_record_config_keeps_its_old_keywords():
    from dyntool.record.policy import RecordConfig, crops
    with pytest.warns(config.DeprecatedKeyWarning, match="query_window"):
        rc = RecordConfig(query_window=[2, 8], key_window=[0, 6])
    assert (rc.query_crop, rc.key_crop) == ([2, 8], [0, 6]) and crops(rc, 10) == ((2, 8), (0, 6))
    assert "query_window" not in config.to_dict(rc)
    from dyntool.train.config import TrainConfig
    assert "record.query_window" not in config.keys(TrainConfig) and "record.query_crop" in config.keys(TrainConfig)
