"""The ICL-MC study's fixed rules on constructed series: stages, the 10 % step, the leading
indicator and its shuffled-time control, the summary over seeds."""
import numpy as np
import pandas as pd
import pytest

from dyntool.record import metric_names as mn
from dyntool.sims import icl_markov_analysis as an


def frame(kls: dict[str, list[float]], every: int = 10, extra: dict | None = None) -> pd.DataFrame:
    n = len(next(iter(kls.values())))
    df = pd.DataFrame({"step": np.arange(n) * every, **{mn.icl_kl(s): v for s, v in kls.items()}})
    for k, v in (extra or {}).items():
        df[k] = v
    return df


def test_stages_need_five_logged_steps_to_start():
    # uniform for 6, a 3-step unigram blip, uniform, unigram from 12 (holds), bigram from 20
    best = ["uniform"] * 6 + ["unigram"] * 3 + ["uniform"] * 3 + ["unigram"] * 8 + ["bigram"] * 10
    kls = {s: [0.0 if b == s else 1.0 for b in best] for s in ("uniform", "unigram", "bigram")}
    st = an.stages(frame(kls))
    assert st == [{"stage": "uniform", "start": 0}, {"stage": "unigram", "start": 120},
                  {"stage": "bigram", "start": 200}]
    assert an.first_start(st, "bigram") == 200 and an.first_start(st, "nope") is None
    # a final stage shorter than 5 logged steps does not count
    best2 = ["uniform"] * 10 + ["bigram"] * 4
    kls2 = {s: [0.0 if b == s else 1.0 for b in best2] for s in ("uniform", "unigram", "bigram")}
    assert [s["stage"] for s in an.stages(frame(kls2))] == ["uniform"]


def test_t10_is_the_first_held_tenth_of_the_change():
    steps = np.arange(20) * 10
    v = np.r_[np.zeros(5), [0.5], np.zeros(2), np.linspace(0.1, 1, 12)]         # a blip at 50, rise from 80
    assert an.t10(steps, v) == 80
    assert an.t10(steps, -v) == 80                                             # falling series alike
    assert an.t10(steps, np.ones(20)) is None                                   # no change


def test_on_logged_grid_averages_each_window():
    df = pd.DataFrame({"step": np.arange(30), "g": np.arange(30, dtype=float)})
    df[mn.icl_kl("bigram")] = np.where(df["step"] % 10 == 0, 1.0, np.nan)
    steps, v = an.on_logged_grid(df, "g")
    assert steps.tolist() == [0, 10, 20] and v.tolist() == [4.5, 14.5, 24.5]


def test_lead_finds_an_indicator_that_moves_first_and_the_control_rejects_noise():
    rng = np.random.default_rng(0)
    n, every, shift = 100, 20, 4
    t = np.arange(n)
    kl = 1 / (1 + np.exp((t - 60) / 2.0)) + 0.002 * rng.standard_normal(n)     # transition at 60
    ind = 1 / (1 + np.exp(-(t - 60 + shift) / 2.0)) + 0.002 * rng.standard_normal(n)
    res = an.lead(t * every, ind, kl, n_perm=200)
    assert res["lag_steps"] == shift * every and res["p"] < 0.02
    noise = an.lead(t * every, rng.standard_normal(n), kl, n_perm=200)
    assert noise["p"] > 0.05


def test_analyse_run_on_a_constructed_run():
    n, every = 40, 10
    t = np.arange(n)
    uni = np.where(t < 10, 0.5, np.where(t < 25, 0.05, 0.3))
    big = np.where(t < 25, 0.4, 0.01)
    df = frame({"uniform": np.where(t < 10, 0.01, 0.2), "unigram": uni, "bigram": big}, every)
    for l in range(2):
        df[mn.head(mn.icl_score("prev_token"), l, 0)] = np.where(t < 20, 0.05, 0.9 if l == 0 else 0.1)
        df[mn.head(mn.icl_score("induction"), l, 0)] = np.where(t < (22 if l == 0 else 18), 0.3, 0.8)
        df[mn.head(mn.SCORE_GRAD_NORM, l, 0)] = np.where(t < 15, 1.0, 2.0)
    a = an.analyse_run(df, 2, 1)
    assert a["order"] == ["uniform", "unigram", "bigram"]
    assert a["unigram_start"] == 100 and a["bigram_start"] == 250
    assert a["prev_token_head"] == [0, 0]
    assert a["heads"]["L0H0"]["induction"]["t10"] == 220 and a["heads"]["L1H0"]["induction"]["t10"] == 180
    assert a["kl_bigram"]["step0"] == 0.4 and a["kl_bigram"]["end"] == pytest.approx(0.01)


def test_summary_counts_the_second_layer_first():
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import summarise, table
    n, every = 40, 10
    t = np.arange(n)
    runs = {}
    for seed, (t0, t1) in enumerate([(22, 18), (15, 25)]):
        df = frame({"uniform": np.where(t < 10, 0.01, 0.2), "unigram": np.where(t < 25, 0.05, 0.3),
                    "bigram": np.where(t < 25 + seed, 0.4, 0.01)}, every)
        for l, tl in enumerate((t0, t1)):
            df[mn.head(mn.icl_score("prev_token"), l, 0)] = np.where(t < tl, 0.05, 0.9)
            df[mn.head(mn.icl_score("induction"), l, 0)] = np.where(t < tl, 0.3, 0.8)
            df[mn.head(mn.SCORE_GRAD_NORM, l, 0)] = np.where(t < tl, 1.0, 2.0)
        runs[seed] = {**an.analyse_run(df, 2, 1), "chance": {"prev_token": 0.05, "induction": 0.3},
                      "bayes_loss": 0.9, "seconds": 1.0}
    cfg = ICLMarkovConfig(seeds=[0, 1], control=False)
    s = summarise(cfg, {"dirichlet": runs}, None)
    d = s["priors"]["dirichlet"]
    assert d["second_layer_first"]["induction"] == {"second_first": 1, "of": 2}
    assert d["bigram_start"]["mean"] == pytest.approx(255) and d["paper_order"] == 2
    assert "bigram stage: starts at step 255 ± 7" in table(s)
    assert d["bigram_payoff"] == s["bigram_payoff"]["dirichlet"] and d["bigram_payoff"]["over_uniform"] > 0.1
    assert f"bigram payoff {d['bigram_payoff']['over_uniform']:.3f} nats over uniform" in table(s)


def test_a_stage_never_reached_is_said_so():
    """Issue 50: the table said "starts at step never"."""
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import summarise, table
    t = np.arange(40)
    df = frame({"uniform": np.full(40, 0.01), "unigram": np.full(40, 0.3), "bigram": np.full(40, 0.4)})
    for l in range(2):
        for q in ("prev_token", "induction"):
            df[mn.head(mn.icl_score(q), l, 0)] = 0.1 + 0.001 * t
        df[mn.head(mn.SCORE_GRAD_NORM, l, 0)] = 1.0
    run = {**an.analyse_run(df, 2, 1), "chance": {"prev_token": 0.05, "induction": 0.3}, "bayes_loss": 0.9,
           "seconds": 1.0}
    out = table(summarise(ICLMarkovConfig(seeds=[0], control=False), {"dirichlet": {0: run}}, None))
    assert "unigram stage: never reached;  bigram stage: never reached" in out
    assert "midpoint: never reached" in out and "step never" not in out


def test_kl_midpoint_is_half_way_down_the_drop_not_the_argmin_crossing():
    steps = np.arange(60) * 20
    # plateau 0.12 after step 0 (0.2), logistic drop centred on logged step 30 to 0.02
    kl = 0.02 + 0.10 / (1 + np.exp((np.arange(60) - 30) / 1.5))
    kl[0] = 0.2
    mid = an.kl_midpoint(steps, kl)
    assert mid == 600                                                     # half-way (0.07) first below at 30
    assert an.kl_midpoint(steps, np.full(60, 0.1)) is None                # no drop
    assert an.kl_midpoint(steps, 0.1 - 0.01 * np.arange(60) / 60) is None  # a 10 % drift is not a transition


def test_circular_null_rejects_a_smooth_series_that_only_moves_with_the_target():
    """A smooth bump that co-moves with the transition (no lead) beats time-shuffles (their
    differences are white noise) but not circular shifts; a real lead survives both."""
    rng = np.random.default_rng(3)
    n, every = 100, 20
    t = np.arange(n)
    kl = 1 / (1 + np.exp((t - 60) / 3.0))
    smooth = np.cumsum(np.cumsum(rng.standard_normal(n)))                 # a smooth random walk
    bump = np.exp(-0.5 * ((t - 60) / 6.0) ** 2) + 1e-3 * smooth
    shuffled, circular = an.lead(t * every, bump, kl, n_perm=300), an.lead(t * every, bump, kl, null="circular")
    assert shuffled["p"] < 0.05 and circular["p"] > shuffled["p"]
    walk = an.lead(t * every, smooth, kl, null="circular")
    assert walk["p"] > 0.05
    lead_ = an.lead(t * every, 1 / (1 + np.exp(-(t - 56) / 3.0)), kl, null="circular")
    assert lead_["lag_steps"] == 4 * every and lead_["p"] < 0.05
    score = 1 / (1 + np.exp(-(t - 60) / 3.0))                            # a rising target: sign = +1
    assert an.lead(t * every, 1 / (1 + np.exp(-(t - 57) / 3.0)), score, null="circular", sign=1.0)["lag_steps"] == 60


def test_claims_compare_the_same_quantity_and_across_quantities():
    from dyntool.sims.icl_markov_claims import claims
    n, every = 40, 10
    t = np.arange(n)
    df = frame({"uniform": np.where(t < 10, 0.01, 0.2), "unigram": np.where(t < 25, 0.05, 0.3),
                "bigram": np.where(t < 25, 0.12, 0.01)}, every)
    df.loc[0, mn.icl_kl("bigram")] = 0.2
    for l, (tp, ti) in enumerate([(22, 30), (35, 16)]):
        df[mn.head(mn.icl_score("prev_token"), l, 0)] = np.where(t < tp, 0.05, 0.9)
        df[mn.head(mn.icl_score("induction"), l, 0)] = np.where(t < ti, 0.3, 0.8)
        df[mn.head(mn.SCORE_GRAD_NORM, l, 0)] = np.where(t < 15, 1.0, 2.0)
        for kt in ("same", "both"):
            df[mn.head(f"lift_{kt}", l, 0)] = np.where(t < 5, 1.0, 0.6)
        df[mn.head("lift_induction", l, 0)] = np.where(t < ti, 1.0, 2.0)
        df[mn.head("lift_neither", l, 0)] = 1.0
    c = claims({0: an.analyse_run(df, 2, 1)}, 2)
    assert c["bigram_mid"]["per_seed"] == [250]
    same = c["layer_order"]["same_quantity"]
    assert same["induction_specific"]["per_seed"] == [140]               # L1 at 160, L0 at 300
    assert same["prev_token"]["per_seed"] == [-130]                      # L1 moves later on this one
    assert c["layer_order"]["across_quantities"]["L1 induction_specific vs L0 prev_token"]["per_seed"] == [60]
    assert c["same_token_avoidance"]["L1_min"]["mean"] == pytest.approx(0.6)


def test_resummarise_two_studies_adds_their_seeds(tmp_path):
    from dyntool import config
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.errors import RunError
    from dyntool.sims.icl_markov_study import resummarise, run_study, table
    cfg = config.load(ICLMarkovConfig, "icl_markov.toml", "ci", values={"steps": 12, "control": False})
    a = run_study(cfg, tmp_path, name="a", quiet=True)
    b = run_study(config.update(cfg, {"seeds": [3]}), tmp_path, name="b", quiet=True)
    s = resummarise([a, b])
    assert s["seeds"] == [0, 3] and sorted(s["priors"]["dirichlet"]["per_seed"]) == ["0", "3"]
    import json
    one = json.loads((a / "summary.json").read_text())
    assert one["priors"]["dirichlet"]["per_seed"]["0"]["kl_bigram"] == s["priors"]["dirichlet"]["per_seed"]["0"]["kl_bigram"]
    # a study stopped mid-run: its unfinished seed is skipped, with the reason, not summarised
    meta = b / "seed3-dirichlet" / "meta.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "status": "interrupted"}))
    s = resummarise([a, b])
    assert s["seeds"] == [0] and s["skipped"] == {"b/seed3-dirichlet": "interrupted"}
    assert "skipped b/seed3-dirichlet: interrupted" in table(s)
    with pytest.raises(RunError, match="seed0-dirichlet is in more than one"):
        resummarise([a, a])
    with pytest.raises(RunError, match="nothing to summarise"):
        resummarise([b])


def test_dense_steps_cover_each_boundary_on_a_grid():
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import dense_steps
    cfg = ICLMarkovConfig(steps=1000, dense_window=30, dense_every=10)
    assert dense_steps([45, 980], cfg) == [10, 20, 30, 40, 50, 60, 70, 950, 960, 970, 980, 990]
    assert dense_steps([], cfg) == []
