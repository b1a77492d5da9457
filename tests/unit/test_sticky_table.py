"""The sticky study's printed and markdown tables: SGD's row sets the steps-to-target threshold
(its own mean final loss), so it shows "(sets the target)" as the README does, never a step count."""
from dyntool.sims.summary import SGD_TARGET, markdown_table, table


def _summary(arms=("sgd", "em", "routing")):
    ms = lambda m, s: {"mean": m, "std": s}                                           # noqa: E731
    steps = {"sgd": ms(731.0, 250.0), "em": ms(458.0, 184.0), "routing": ms(272.0, 80.0)}
    final = {a: {"final_loss": ms(2.0 - 0.01 * k, 0.02), "entropy": ms(2.05, 0.01), "accuracy": ms(0.2, 0.01),
                 "heldout_loss": ms(2.04, 0.02), "heldout_entropy": ms(2.06, 0.01), "heldout_accuracy": ms(0.18, 0.01)}
             for k, a in enumerate(arms)}
    return {"h_min": 1.8292, "log_n": 2.0794, "T": 2000, "steps": 1000, "seeds": [42, 2024],
            "heldout": {"offset": 10000}, "final": final,
            "entropy_gap": {a: {"raw": ms(0.2, 0.0), "heldout": ms(0.21, 0.0)} for a in arms},
            "arms": {a: {"lrs": [0.01] * 4, "steps_to_target": {**steps[a], "per_seed": [1, 2]},
                         **({} if a == "em" else {"vs_em": {  # paired tests against em, as summarise() writes
                             "steps_to_target": {"t": 3.0, "p": 0.2, "mean_diff": 111.0},
                             "final_heldout_loss": {"t": 2.0, "p": 0.3, "mean_diff": 0.05}}})}
                     for a in arms}}


def _row(text: str, arm: str) -> str:
    return next(line for line in text.splitlines() if line.split()[0].strip("|").strip() == arm
                or line.startswith(f"| {arm} |"))


def test_printed_table_says_sgd_sets_the_target():
    t = table(_summary())
    sgd, em, routing = _row(t, "sgd"), _row(t, "em"), _row(t, "routing")
    assert SGD_TARGET in sgd and "731" not in sgd and "250" not in sgd
    assert "458 ± 184" in em and SGD_TARGET not in em
    assert "272 ± 80" in routing
    assert "steps to SGD final" in t.splitlines()[1]
    # the paired line for sgd keeps the held-out loss test but not its steps to its own target
    paired = {line.split(" − ")[0]: line for line in t.splitlines() if " − em, paired" in line}
    assert "steps to target" not in paired["sgd"] and "final heldout loss" in paired["sgd"]
    assert "steps to target +111" in paired["routing"]


def test_markdown_table_says_sgd_sets_the_target():
    t = markdown_table(_summary())
    sgd = _row(t, "sgd")
    assert sgd.rstrip().endswith(f"| {SGD_TARGET} |") and "731" not in sgd
    assert _row(t, "em").rstrip().endswith("| 458 ± 184 |")


def test_without_an_arms_table_there_is_no_steps_column():
    s = _summary()
    del s["arms"]
    assert SGD_TARGET not in table(s) and "steps to SGD final" not in table(s)


def test_settle_step_and_ordering_phrase():
    from dyntool.sims.frame_precision import ordering_phrase, settle_step
    steps = [10, 20, 30, 40]
    assert settle_step(steps, [1.0, 0.5, 0.05, 0.01]) == 30
    assert settle_step(steps, [1.0, 0.05, 0.5, 0.01]) is None        # rises again: not settled at 20
    assert settle_step(steps, [0.1, 0.2, 0.5, 1.0]) is None
    # attention drift rising through the record (the EM-like sticky run): the caption must say so
    ph = ordering_phrase(steps, [0.1, 0.2, 0.5, 1.0], [1.0, 0.05, 0.01, 0.01], "EM-like")
    assert "does NOT settle before" in ph and "peaks at step 40" in ph
    assert "attention settles first" in ordering_phrase(steps, [1.0, 0.01, 0.01, 0.01], [1.0, 1.0, 0.05, 0.01], "x")


def test_f7_shares_are_learning_rate_weighted():
    """Panel (c) of F7: each group's share of Σ η_p‖g_p‖² (the first-order loss decrease), against
    the closed form from the logged gradient norms and the run's own learning rates."""
    from types import SimpleNamespace

    import numpy as np
    import pandas as pd

    from dyntool.figures.frame_precision import descent_shares
    g = {"diag_grad_norm_qk": [0.3, 0.2], "diag_grad_norm_v": [0.1, 0.4], "diag_grad_norm_o": [0.2, 0.2]}
    metrics = pd.DataFrame({"step": [0, 10], **g, "diag_share_qk": [0.5, 0.5], "diag_share_v": [0.25, 0.25],
                            "diag_share_o": [0.25, 0.25]})
    lrs = {"W_Q": 0.01, "W_K": 0.01, "W_V": 0.1, "W_O": 0.01}
    df, weighted = descent_shares(SimpleNamespace(config={"lrs": lrs}, metrics=metrics))
    assert weighted
    e = np.array([[0.01 * 0.3 ** 2, 0.1 * 0.1 ** 2, 0.01 * 0.2 ** 2], [0.01 * 0.2 ** 2, 0.1 * 0.4 ** 2, 0.01 * 0.2 ** 2]])
    want = e / e.sum(1, keepdims=True)
    np.testing.assert_allclose(df[["share_routing", "share_values", "share_readout"]].to_numpy(), want, rtol=1e-12)
    # no learning rates recorded (an older run): the unweighted logged shares, flagged as such
    df, weighted = descent_shares(SimpleNamespace(config={}, metrics=metrics))
    assert not weighted and df["share_routing"].tolist() == [0.5, 0.5]
    # W_Q and W_K at different rates can't be weighted from ‖g_Q‖² + ‖g_K‖²: unweighted, flagged
    _, weighted = descent_shares(SimpleNamespace(config={"lrs": {**lrs, "W_K": 0.1}}, metrics=metrics))
    assert not weighted


def test_controls_keep_the_seeds_a_user_config_sets(tmp_path):
    """--controls runs ten seeds unless the user chose seeds: an override or their own config file
    that sets them (the packaged default file's five README seeds are not a choice)."""
    from types import SimpleNamespace

    from dyntool.cli.sim import _user_seeds
    mine = tmp_path / "mine.toml"
    mine.write_text("seeds = [3, 4]\nsteps = 5\n")
    other = tmp_path / "other.toml"
    other.write_text("steps = 5\n")
    assert _user_seeds(SimpleNamespace(overrides=[], config=str(mine)))
    assert not _user_seeds(SimpleNamespace(overrides=[], config=str(other)))
    assert not _user_seeds(SimpleNamespace(overrides=[], config="sticky_markov"))
    assert not _user_seeds(SimpleNamespace(overrides=[], config=None))
    assert _user_seeds(SimpleNamespace(overrides=["--seeds=1,2"], config="sticky_markov"))
