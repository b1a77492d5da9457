"""``dyntool sim icl-markov``: the in-context Markov chain study (Edelman et al. 2024, arXiv 2402.11004).

A study folder holds one run per (seed, prior) — ``seed{S}-dirichlet`` and, with ``control``,
``seed{S}-doubly_stochastic`` (the control prior whose chains all have uniform stationary
distributions) — and, with ``dense_rerun``, ``seed{S}-dirichlet-dense``: the first seed rerun with
the same seed and the full tier every ``dense_every`` steps within ± ``dense_window`` of that run's
stage boundaries (advantages exist only on full-tier steps).  After the runs, ``summary.json``
(:func:`summarise`) and the printed table (:func:`table`): per seed and as mean ± sd, each number
beside its step-0 value.
"""
from __future__ import annotations

import datetime as _dt
import time
from pathlib import Path

import numpy as np

from .. import config as _config
from ..config import to_dict
from ..errors import RunError
from ..record import metric_names as mn
from ..record.policy import check_budget, schedule
from ..run import open_run
from ..run_writer import write_json_atomic, ensure_out_dir
from ..train.ddp import resolve_device
from .icl_markov import run_one
from .icl_markov_analysis import advantage_to_previous, analyse_run, logged
from .icl_markov_claims import at_step, claims, fmt, ms, table_lines
from .icl_markov_config import ICLMarkovConfig
from .icl_markov_resume import chain, continue_run, metrics as chain_metrics, seconds as chain_seconds, steps_done
from .icl_markov_task import bigram_payoff
from .resume import set_next_step

CONTROL = "doubly_stochastic"


def run_name(seed: int, prior: str, dense: bool = False) -> str:
    return f"seed{seed}-{prior}" + ("-dense" if dense else "")


def study_priors(prior: str, control: bool, control_prior: str = CONTROL, extra=()) -> list[str]:
    """The training priors of a study, each once: its prior, the control, the extra priors."""
    out = [prior] + ([control_prior] if control else []) + list(extra)
    return list(dict.fromkeys(out))


def dense_steps(boundaries: list[int], cfg: ICLMarkovConfig) -> list[int]:
    """Full-tier steps every ``dense_every`` within ± ``dense_window`` of each boundary."""
    out: set[int] = set()
    for b in boundaries:
        lo, hi = max(0, b - cfg.dense_window), min(cfg.steps - 1, b + cfg.dense_window)
        out.update(range(lo - lo % cfg.dense_every, hi + 1, cfg.dense_every))
    return sorted(s for s in out if 0 <= s < cfg.steps)


def run_study(cfg: ICLMarkovConfig, out_dir: str, name: str | None = None, tags=None, quiet: bool = False,
              resume: Path | None = None) -> Path:
    """Run the study (or, ``resume``: go on with that study folder, :mod:`.icl_markov_resume`);
    -> its folder.  Every run done: summary.json is written; a run stopped at the time limit or
    stop_at_step: no summary, and study.json's ``next_step`` says how to continue."""
    if resume is None:
        out = ensure_out_dir(out_dir)
        study = out / (name or f"icl-markov-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
        if study.exists():
            raise RunError(f"study {study} already exists; choose another --name (nothing is overwritten)")
    else:
        study, out = resume, resume.parent
    priors = study_priors(cfg.prior, cfg.control, cfg.control_prior, cfg.extra_priors)
    _check_budget(cfg, len(cfg.seeds) * len(priors) + bool(cfg.dense_rerun), out)   # before anything exists
    resolve_device(cfg.device)                                     # as is a device this machine lacks
    if resume is None:
        study.mkdir()
        write_json_atomic(study / "study.json", {"kind": "icl-markov-study", "config": to_dict(cfg)})
    # the whole call's time limit: every run stops (checkpointed) before a step begun past it
    deadline = time.perf_counter() + 60 * cfg.time_limit_min if cfg.time_limit_min > 0 else None

    trained = []                    # the runs this call trained: past the time limit, no other begins

    def one(seed, prior, dense=False, extra=None):
        """A (seed, prior)'s analysis, running or continuing it first; None when it stopped."""
        links = chain(study, run_name(seed, prior, dense))
        if not links or steps_done(links) < cfg.steps:
            if trained and deadline is not None and time.perf_counter() > deadline:
                set_next_step(study, f"stopped at its time limit; continue with: dyntool sim icl-markov --resume {study}")
                return None
            trained.append(run_name(seed, prior, dense))
            sd, new, frm = continue_run(links) if links else (None, run_name(seed, prior, dense), None)
            try:
                run_one(cfg, study, seed, prior, new, tags, quiet, extra_record_steps=extra, study=study.name,
                        resume=sd, resumed_from=frm, deadline=deadline)
            except KeyboardInterrupt as e:     # Ctrl-C / SIGTERM: the study says how to go on, as the run does
                if getattr(e, "next_step", None):
                    set_next_step(study, e.next_step)
                raise
            links = chain(study, run_name(seed, prior, dense))
            if steps_done(links) < cfg.steps:
                return None
        return _analyse(links, cfg)
    per: dict[str, dict[int, dict]] = {p: {} for p in priors}
    for seed in cfg.seeds:
        for prior in priors:
            if (got := one(seed, prior)) is None:
                return _stopped(study, chain(study, run_name(seed, prior)), trained)
            per[prior][seed] = got
    dense = None
    if cfg.dense_rerun:
        seed = cfg.seeds[0]
        first = per[cfg.prior][seed]
        bounds = [b for b in (first["unigram_start"], first["bigram_start"]) if b is not None]
        if one(seed, cfg.prior, True, dense_steps(bounds, cfg)) is None:
            return _stopped(study, chain(study, run_name(seed, cfg.prior, True)), trained)
        dense = _dense_info(study, seed, cfg.prior, study / run_name(seed, cfg.prior, dense=True), bounds, first)
    summary = summarise(cfg, per, dense)
    write_json_atomic(study / "summary.json", summary)
    set_next_step(study, None)
    return study


def _stopped(study: Path, links: list[Path], trained: list[str]) -> Path:
    """The study stopped in the chain ``links`` (or, none begun, at its time limit, already said):
    study.json says how to go on."""
    said = _load_json(links[-1] / "meta.json").get("final", {}).get("next_step") if links else None
    if said and links[0].name in trained:              # that run stopped in this call
        set_next_step(study, said)
    return study


def _check_budget(cfg: ICLMarkovConfig, n_runs: int, out: Path) -> None:
    """Refuse a study whose full tier would exceed record.disk_budget_gb (all runs together; a dense
    rerun counted at its largest, every dense_every steps throughout)."""
    m = cfg.model
    hs = m.n_embd // m.n_head
    n = len(schedule(cfg.record, cfg.steps)) * n_runs
    if cfg.dense_rerun:
        n += cfg.steps // cfg.dense_every
    check_budget(cfg.record, n, out, L=m.n_layer, H=m.n_head, T=cfg.T, d_k=hs, d_v=hs)


def resummarise(studies: list[str | Path]) -> dict:
    """The summary of one or more study folders of the same config but for their seeds and priors
    (e.g. seeds 0–4 and 5–9 run as two studies), re-analysed from their runs' metrics.  Every
    finished run enters; a run that did not finish (a study stopped mid-run keeps its seeds in
    study.json but not all their runs) is listed under ``skipped`` with its status, so each prior
    says over how many seeds it was summarised and comparisons across priors use their common seeds."""
    paths = [Path(s) for s in studies]
    raw = _load_json(paths[0] / "study.json")
    cfg = _config.update(ICLMarkovConfig(), raw["config"])
    per: dict[str, dict[int, dict]] = {}
    seeds: list[int] = []
    skipped: dict[str, str] = {}
    dense = None
    for study in paths:
        scfg = _load_json(study / "study.json")["config"]
        for seed in scfg["seeds"]:
            for prior in study_priors(scfg["prior"], scfg["control"], scfg.get("control_prior", CONTROL),
                                      scfg.get("extra_priors", [])):
                path = study / run_name(seed, prior)
                links = chain(study, path.name)          # the run and its continuations (--resume)
                status = _status(links[-1] if links else path)
                if status == "finished" and steps_done(links) < scfg["steps"]:
                    status = f"stopped at step {steps_done(links)}"
                if status != "finished":
                    skipped[f"{study.name}/{path.name}"] = status
                    continue
                if seed in per.get(prior, {}):
                    raise RunError(f"{run_name(seed, prior)} is in more than one of the studies; summarise each run once")
                per.setdefault(prior, {})[seed] = _analyse(links, cfg)
                seeds += [seed] if seed not in seeds else []
        d = study / run_name(scfg["seeds"][0], scfg["prior"], dense=True)
        if dense is None and d.exists() and scfg["seeds"][0] in per.get(scfg["prior"], {}):
            first = per[scfg["prior"]][scfg["seeds"][0]]
            bounds = [b for b in (first["unigram_start"], first["bigram_start"]) if b is not None]
            dense = _dense_info(study, scfg["seeds"][0], scfg["prior"], d, bounds, first)
    if not per:
        raise RunError(f"no run of {', '.join(map(str, paths))} finished; nothing to summarise")
    cfg.seeds = seeds
    out = summarise(cfg, per, dense)
    out["studies"] = [str(p) for p in paths]
    out["skipped"] = skipped
    return out


def _status(path: Path) -> str:
    """'finished', or what a run folder is instead ('missing', 'interrupted', ...)."""
    if not (path / "meta.json").exists():
        return "missing"
    return str(_load_json(path / "meta.json").get("status") or "unknown")


def _dense_info(study: Path, seed: int, prior: str, path: Path, bounds: list[int], first: dict) -> dict:
    """The dense rerun: its full-tier steps, whether it trained as the first run did, and the
    previous-token head's advantage toward the previous position on each full-tier step."""
    run = open_run(path)
    adv = advantage_to_previous(run, *first["prev_token_head"])
    return {"seed": seed, "run": path.name, "boundaries": bounds, "full_tier_steps": len(run.steps),
            "same_as_first": _same_metrics(study / run_name(seed, prior), path),
            "prev_token_head": first["prev_token_head"], "advantage_to_previous": adv}


def _load_json(path: Path) -> dict:
    import json
    return json.loads(Path(path).read_text())


def _analyse(links: list[Path] | Path, cfg: ICLMarkovConfig) -> dict:
    """One (seed, prior)'s numbers from its run, or its chain of resumed runs (rows joined)."""
    links = [links] if isinstance(links, Path) else links
    meta = open_run(links[-1]).meta
    a = analyse_run(chain_metrics(links), cfg.model.n_layer, cfg.model.n_head)
    a["chance"] = meta.get("chance")
    a["bayes_loss"] = meta.get("bayes_loss")
    a["seconds"] = chain_seconds(links)
    return a


def _same_metrics(a: Path, b: Path) -> bool:
    """Did the seeded rerun train the same way (its logged KLs equal the first run's)?"""
    ka, kb = (logged(open_run(p).metrics)[mn.icl_kl("bigram")].to_numpy(float) for p in (a, b))
    return bool(len(ka) == len(kb) and np.allclose(ka, kb, rtol=1e-6, atol=1e-9))


def summarise(cfg: ICLMarkovConfig, per: dict[str, dict[int, dict]], dense: dict | None) -> dict:
    """The study's numbers: per prior, per seed and mean ± sd (sample sd), step-0 values beside."""
    out: dict = {"k": cfg.k, "alpha": cfg.alpha, "T": cfg.T, "steps": cfg.steps, "seeds": list(cfg.seeds),
                 "eval_every": cfg.eval_every, "rules": _RULES, "priors": {}}
    for prior, runs in per.items():
        seeds = sorted(runs)
        agg: dict = {"per_seed": {str(s): runs[s] for s in seeds}}
        for key in ("unigram_start", "bigram_start"):
            agg[key] = ms([runs[s][key] for s in seeds])
        agg["orders"] = {str(s): runs[s]["order"] for s in seeds}
        agg["paper_order"] = sum(runs[s]["order"] == ["uniform", "unigram", "bigram"] for s in seeds)
        for strat in ("uniform", "unigram", "bigram"):
            agg[f"kl_{strat}"] = {w: ms([runs[s][f"kl_{strat}"][w] for s in seeds]) for w in ("step0", "end", "min")}
        first = runs[seeds[0]]["heads"]
        agg["heads"] = {hd: {q: {w: ms([runs[s]["heads"][hd][q][w] for s in seeds]) for w in first[hd][q]}
                             for q in first[hd]} for hd in first}
        agg["second_layer_first"] = _layer_order(runs, seeds, cfg)
        agg["lead"] = {"lag_steps": ms([runs[s]["lead"]["lag_steps"] for s in seeds]),
                       "r": ms([runs[s]["lead"]["r"] for s in seeds]),
                       "p_below_0.05": sum((runs[s]["lead"]["p"] or 1) < 0.05 for s in seeds),
}
        agg["claims"] = claims(runs, cfg.model.n_layer)
        agg["chance"] = runs[seeds[0]]["chance"]
        agg["bayes_loss"] = ms([runs[s]["bayes_loss"] for s in seeds])
        agg["seconds"] = ms([runs[s]["seconds"] for s in seeds])
        out["priors"][prior] = agg
    out["bigram_payoff"] = payoffs(cfg, list(per))
    for prior, agg in out["priors"].items():             # beside each prior's stage times, too
        agg["bigram_payoff"] = out["bigram_payoff"].get(prior)
    ctrl = cfg.control_prior
    if cfg.control and ctrl in per and cfg.prior in per and cfg.prior != ctrl:
        a, b = per[cfg.prior], per[ctrl]
        common = sorted(set(a) & set(b))
        diff = [(b[s]["bigram_start"] - a[s]["bigram_start"]) if None not in (a[s]["bigram_start"],
                b[s]["bigram_start"]) else None for s in common]
        out["control"] = {"prior": ctrl, "bigram_start_difference": ms(diff), "per_seed": dict(zip(map(str, common), diff)),
                          "control_has_unigram_stage": sum(b[s]["unigram_start"] is not None for s in common),
                          "of": len(common)}
    out["dense_rerun"] = dense
    return out


def payoffs(cfg: ICLMarkovConfig, priors: list[str], n: int = 2000) -> dict:
    """Each training prior's bigram payoff (:func:`.icl_markov_task.bigram_payoff`, Monte Carlo on
    ``n`` sequences from a fixed generator), so transition times are read beside signal strength."""
    return {p: bigram_payoff(cfg.k, cfg.alpha, p, cfg.T, n, np.random.default_rng(12345), cfg.unigram_share)
            for p in dict.fromkeys([*priors, *cfg.eval_priors])}


def _layer_order(runs, seeds, cfg) -> dict:
    """Per quantity, the *same* quantity in both layers: in how many seeds the second layer's 10 %
    step comes before the first's (the comparison across quantities — L1's induction score against
    L0's previous-token score — is in ``claims.layer_order.across_quantities``)."""
    if cfg.model.n_layer < 2:
        return {}
    out = {}
    for q in ("prev_token", "induction", "score_grad_norm"):
        wins, both = 0, 0
        for s in seeds:
            t0 = min((v[q]["t10"] for hd, v in runs[s]["heads"].items() if hd.startswith("L0H") and
                      v[q]["t10"] is not None), default=None)
            t1 = min((v[q]["t10"] for hd, v in runs[s]["heads"].items() if hd.startswith("L1H") and
                      v[q]["t10"] is not None), default=None)
            if t0 is not None and t1 is not None:
                both += 1
                wins += t1 < t0
        out[q] = {"second_first": wins, "of": both}
    return out


_RULES = ("stage = argmin KL(strategy || model) at a logged step; a stage starts at the first logged step from "
          "which it holds 5 logged steps.  bigram_mid = the first logged step from which KL(bigram) stays below "
          "half-way between its highest value after step 0 and its end, for 5 logged steps.  t10 = first logged "
          "step from which a series stays >= 10 % of its change (first logged value -> mean of the last 5) for 5 "
          "logged steps; per-step cheap-tier series averaged per logged window.  second_layer_first = the same "
          "quantity's t10 in L1 before L0.  lead = lag of max corr(diff indicator(t), -diff KL_bigram(t + lag)), "
          "|lag| <= 20 logged steps; nulls: 500 time permutations of the indicator's differences (lead), every "
          "circular shift beyond 20 logged steps (claims' lead_circular, lead_over_prev_token).  lift = attention "
          "mass on a key type / its share of the visible keys; induction_specific = lift(induction) / "
          "lift(neither).")


def table(summary: dict) -> str:
    """The printed table of a study's summary.json."""
    lines = [f"ICL-MC: k = {summary['k']}, α = {summary['alpha']}, T = {summary['T']}, {summary['steps']} steps, "
             f"seeds {summary['seeds']}  (mean ± sd over seeds; step 0 -> end)"]
    for prior, a in summary["priors"].items():
        pay = a.get("bigram_payoff")
        own = [int(x) for x in a["orders"]]
        lines.append(f"\n[{prior}]" + (f" (seeds {own})" if own != list(summary["seeds"]) else "")
                     + f"  stage order uniform→unigram→bigram in {a['paper_order']}/{len(a['orders'])} seeds"
                     + (f";  bigram payoff {pay['over_uniform']:.3f} nats over uniform" if pay else ""))
        lines.append(f"  unigram stage: {at_step(a['unigram_start'])};  bigram stage: {at_step(a['bigram_start'])}")
        for strat in ("uniform", "unigram", "bigram"):
            k = a[f"kl_{strat}"]
            lines.append(f"  KL({strat:<7} ‖ model)  {fmt(k['step0'], 4)} -> {fmt(k['end'], 4)}  (min {fmt(k['min'], 4)})")
        ch = a.get("chance") or {}
        for hd, qs in a["heads"].items():
            lines.append(f"  {hd}: prev-token {fmt(qs['prev_token']['step0'], 3)} -> {fmt(qs['prev_token']['end'], 3)} "
                         f"(chance {ch.get('prev_token', float('nan')):.3f}, t10 {fmt(qs['prev_token']['t10'])});  "
                         f"induction {fmt(qs['induction']['step0'], 3)} -> {fmt(qs['induction']['end'], 3)} "
                         f"(chance {ch.get('induction', float('nan')):.3f}, t10 {fmt(qs['induction']['t10'])});  "
                         f"‖∂L/∂S‖ t10 {fmt(qs['score_grad_norm']['t10'])}, peak {fmt(qs['score_grad_norm']['peak_step'])}")
        for q, v in a["second_layer_first"].items():
            lines.append(f"  same quantity in both layers, L1 reaches 10 % of its change before L0 ({q}): "
                         f"{v['second_first']}/{v['of']} seeds")
        ld = a["lead"]
        lines.append(f"  leading indicator (‖∂L/∂S‖ of the previous-token head vs the bigram transition): lag "
                     f"{fmt(ld['lag_steps'], none='- (no test)')} steps, r {fmt(ld['r'], 2, none='-')}, p < 0.05 (shuffled time) in "
                     f"{ld['p_below_0.05']}/{len(a['orders'])} seeds")
        lines += table_lines(a["claims"])
    for p, v in (summary.get("bigram_payoff") or {}).items():
        lines.append(f"bigram payoff of {p} chains: {v['over_uniform']:.3f} nats over uniform, "
                     f"{v['over_unigram']:.3f} over unigram (Monte Carlo, ± {v['over_uniform_se']:.3f})")
    if summary.get("control"):
        c = summary["control"]
        lines.append(f"\ncontrol prior ({c.get('prior', CONTROL)}): bigram stage starts "
                     f"{fmt(c['bigram_start_difference'], none='- (not reached under both priors in any seed)')} steps "
                     f"later than under the Dirichlet prior (negative: earlier); a unigram stage in {c['control_has_unigram_stage']}/"
                     f"{c['of']} seeds")
    for run, why in (summary.get("skipped") or {}).items():
        lines.append(f"skipped {run}: {why}")
    if summary.get("dense_rerun"):
        d = summary["dense_rerun"]
        lines.append(f"dense rerun of seed {d['seed']}: {d['full_tier_steps']} full-tier steps around {d['boundaries']}; "
                     f"same training as the first run: {d['same_as_first']}")
    return "\n".join(lines)
