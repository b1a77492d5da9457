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
    assert "bigram stage at step 255 ± 7" in table(s)


def test_peak_lead_and_its_shuffled_time_chance():
    steps = np.arange(100) * 20
    g = np.exp(-0.5 * ((steps - 400) / 60.0) ** 2)                        # peaks at 400
    res = an.peak_lead(steps, g, 520)
    assert res == {"peak_step": 400, "lead_steps": 120, "p": 6 / 100}      # logged steps 400..500
    assert an.peak_lead(steps, g, None)["lead_steps"] is None
    assert an.peak_lead(steps, g, 300)["lead_steps"] == -100              # peak after the start


def test_resummarise_two_studies_adds_their_seeds(tmp_path):
    from dyntool import config
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import resummarise, run_study
    cfg = config.load(ICLMarkovConfig, "icl_markov.toml", "ci", values={"steps": 12, "control": False})
    a = run_study(cfg, tmp_path, name="a", quiet=True)
    b = run_study(config.update(cfg, {"seeds": [3]}), tmp_path, name="b", quiet=True)
    s = resummarise([a, b])
    assert s["seeds"] == [0, 3] and sorted(s["priors"]["dirichlet"]["per_seed"]) == ["0", "3"]
    import json
    one = json.loads((a / "summary.json").read_text())
    assert one["priors"]["dirichlet"]["per_seed"]["0"]["kl_bigram"] == s["priors"]["dirichlet"]["per_seed"]["0"]["kl_bigram"]


def test_dense_steps_cover_each_boundary_on_a_grid():
    from dyntool.sims.icl_markov_config import ICLMarkovConfig
    from dyntool.sims.icl_markov_study import dense_steps
    cfg = ICLMarkovConfig(steps=1000, dense_window=30, dense_every=10)
    assert dense_steps([45, 980], cfg) == [10, 20, 30, 40, 50, 60, 70, 950, 960, 970, 980, 990]
    assert dense_steps([], cfg) == []
