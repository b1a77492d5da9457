"""The sticky study resolves its config into a new object (the recorded crop filled in) and never
changes the caller's config."""
import copy

from dyntool.config import to_dict
from dyntool.sims.sticky import StickyConfig, plan_study, resolve_config


def test_resolve_config_fills_the_crop_on_a_copy():
    cfg = StickyConfig(T=400, crop=60, arms=["sgd", "em", "sgd_tuned"], seeds=[1, 2], record_seeds=1)
    before = copy.deepcopy(to_dict(cfg))
    res = resolve_config(cfg)
    assert res.record.query_crop == [339, 399] and res.record.key_crop == [339, 399]
    assert to_dict(cfg) == before                        # the caller's config is unchanged
    assert cfg.record.query_crop == [] and res.record is not cfg.record


def test_resolve_config_keeps_given_crops():
    cfg = StickyConfig(T=400)
    cfg.record.query_crop = [10, 20]
    res = resolve_config(cfg)
    assert res.record.query_crop == [10, 20] and res.record.key_crop == [10, 20]


def test_plan_study_runs_and_recorded():
    cfg = StickyConfig(T=400, arms=["sgd", "em", "sgd_tuned"], seeds=[1, 2], record_seeds=1, sweep=[2.0])
    before = copy.deepcopy(to_dict(cfg))
    plan = plan_study(cfg)
    names = [plan.run_name(s, a) for s, a in plan.runs]
    # sgd_tuned reuses sgd for grid LR 0.01 and trains the other grid points
    assert names[:6] == ["seed1-sgd", "seed1-em", "seed1-em-x2", "seed1-lr0.03", "seed1-lr0.1", "seed1-lr0.3"]
    assert plan.grid == {0.01: "sgd", 0.03: "lr0.03", 0.1: "lr0.1", 0.3: "lr0.3"}
    assert [n for n, r in zip(names, plan.recorded) if r] == ["seed1-sgd", "seed1-em"]
    assert plan.N == 399 and to_dict(cfg) == before
