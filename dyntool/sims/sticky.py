"""``dyntool sim sticky-markov``: the sticky Markov-chain study of arXiv 2512.22473, sticky Markov-chain task (EM-like vs SGD).

All (seed, arm) runs train together in one batched closed-form engine
(:mod:`dyntool.sims.single_head`); each still gets its own run directory and recording.  The
study directory holds ``summary.json`` (arXiv 2512.22473, sticky Markov-chain task metrics, the t-test, entropy gaps, optional
value-LR sweep) next to the runs ``seed{S}-{arm}``.

Arms and the config: :mod:`dyntool.sims.sticky_config`.
Checkpoints and ``--resume STUDY`` (the study as one, the runs being one batch): :mod:`.sticky_resume`.

Held-out evaluation: seed s is evaluated on a second sequence of the same chain,
``generate(s + heldout_offset)`` (10000 as in the authors' deep variant), every
``heldout_every`` steps and at the end (metrics ``heldout_loss/entropy/accuracy/entropy_gap``).
"""
from __future__ import annotations

import datetime as _dt
import time as _time
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

from ..config import to_dict
from ..errors import RunError
from ..manifold import baseline_comparison, manifold_metrics, pca
from ..progress import progress
from ..record.policy import RecordConfig, check_budget
from ..record import metric_names as mn
from ..recorder import Recorder
from ..run_writer import RunWriter, write_json_atomic, ensure_out_dir
from ..storage import open_backend
from ..steps import STATE_ROWS
from . import single_head as engine
from . import sticky_resume
from .diagnostics import step_record_threaded
from .summary import geometry_summary, summarise
from .sticky_config import ARMS, CONTROLS, StickyConfig, Arm, expand_arms  # noqa: F401  (re-exported: tests, the CLI)
from .sticky_data import filter_entropy, filter_nll, generate, h_min, stationary, transition_matrix


def _heldout_manifold(W, x_ho: torch.Tensor, H_ho: np.ndarray, executor=None, base=None) -> list[dict]:
    """D6–D7 (dyntool.manifold) per run on HELD-OUT positions, for head outputs g_i and values v_j,
    each with its baselines (the raw input x: its own metrics, the partial R² beyond it, the
    ordering score's permutation null).  ``base``: per run, manifold_metrics of x (fixed data)."""
    g = engine.head_outputs(W, x_ho, executor=executor).double().numpy()           # (R, N, d_v)
    v = (x_ho @ W.W_V).double().numpy()
    xb = x_ho.double().numpy()

    def one(r):
        row = {}
        bm = base[r] if base is not None else manifold_metrics(xb[r], H_ho[r])
        pre = mn.sticky_manifold(mn.STICKY_BASELINE)
        row.update({k: float(val) for k, val in bm.as_dict(pre).items() if k[len(pre):] in _MANIFOLD_KEYS})
        for tag, rep in (("g", g[r]), ("v", v[r])):
            pre = mn.sticky_manifold(tag)
            p = pca(rep, orient_by=H_ho[r])                                  # one SVD for both calls
            m = manifold_metrics(rep, H_ho[r], pca_result=p).as_dict(pre)
            row.update({k: float(val) for k, val in m.items() if k[len(pre):] in _MANIFOLD_KEYS})
            c = baseline_comparison(rep, H_ho[r], xb[r], baseline_metrics=bm, pca_result=p)
            row.update({pre + k: v for k, v in c.items() if not k.startswith("baseline_")})
        return row
    # (N, d_v) SVDs and least squares are tiny: one BLAS thread each, runs spread over Python threads
    # (OpenBLAS's own threads spin on small problems; docs/performance.md)
    with threadpool_limits(1):
        if executor is None:                  # no engine workers to borrow: run them here
            return [one(r) for r in range(g.shape[0])]
        return list(executor.map(one, range(g.shape[0])))


def _entropy_stats(data, held, hmin: float) -> dict:
    """Spread of H_Bayes over positions (mean over seeds): is there anything for D6–D7 to find?"""
    def st(H):
        H = np.concatenate([h.numpy()[None] for h in H])
        return {"std": float(H.std(1).mean()), "p05": float(np.percentile(H, 5, axis=1).mean()),
                "p95": float(np.percentile(H, 95, axis=1).mean()),
                "frac_within_0.01_of_h_min": float((np.abs(H - hmin) < 0.01).mean())}
    out = {"train": st([v[1] for v in data.values()])}
    if held:
        out["heldout"] = st([v[1] for v in held.values()])
    return out


_MANIFOLD_KEYS = ("pc1_share", "participation_ratio", "r_pc1", "r_pc2", "r_pc3", "r_pc4", "r_pc5", "r_best",
                  "r2_linear", "ordering_score")
# compared against the baseline and at step 0 in summary.json (dyntool.sims.summary.geometry)
GEOMETRY_KEYS = ("r2_linear", "r_pc1", "r_best", "ordering_score", mn.R2_PARTIAL, mn.ORDERING_NULL_MEAN,
                 mn.ORDERING_NULL_P)


# ------------------------------------------------------------------------------------------------
# The study, top to bottom: config -> data -> arms -> train and record -> summary
# ------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Plan:
    """The study as it will run: the config with its recorded crop resolved (a copy: the caller's
    config is never changed), the (seed, arm) runs in batch order and which of them store arrays."""
    cfg: StickyConfig
    runs: list[tuple[int, Arm]]            # (seed, arm), the engine's batch order
    grid: dict[float, str]                  # sgd_tuned: grid LR -> the run that trains it
    recorded: list[bool]                    # per run: arrays on disk (others log metrics only)
    start: dict | None = None               # --resume: {ckpt, from} (sticky_resume.load)

    @property
    def N(self) -> int:
        """(input, target) pairs per sequence: T − 1."""
        return self.cfg.T - 1

    @property
    def rec(self) -> RecordConfig:
        return self.cfg.record

    def run_name(self, seed: int, a: Arm) -> str:
        return f"seed{seed}-{a.name}"


def resolve_config(cfg: StickyConfig) -> StickyConfig:
    """``cfg`` with the recorded query/key crop filled in (default: the last ``cfg.crop``
    positions), as a new config; ``cfg`` itself is left as given."""
    N = cfg.T - 1
    qw = list(cfg.record.query_crop) or [max(0, N - cfg.crop), N]
    kw = list(cfg.record.key_crop) or list(qw)
    return replace(cfg, record=replace(cfg.record, query_crop=qw, key_crop=kw))


def plan_study(cfg: StickyConfig) -> _Plan:
    cfg = resolve_config(cfg)
    arms, grid = expand_arms(cfg)
    runs = [(seed, a) for seed in cfg.seeds for a in arms]
    rec_seeds = set(cfg.seeds[:cfg.record_seeds] if cfg.record_seeds else cfg.seeds)
    recorded = [a.name in cfg.arms and a.name in cfg.record_arms and s in rec_seeds for s, a in runs]
    return _Plan(cfg, runs, grid, recorded)


def _open_study(plan: _Plan, out: Path, study: Path) -> None:
    """Refuse a recording over the disk budget, then create the study folder and its study.json."""
    cfg, rec = plan.cfg, plan.rec
    n_records = (len(range(0, cfg.steps + 1, max(rec.every, 1))) + 1) * sum(plan.recorded)
    est = check_budget(rec, n_records, out, L=1, H=1, T=plan.N, d_k=cfg.d_k, d_v=cfg.d_v) if rec.enabled else 0
    study.mkdir()
    write_json_atomic(study / "study.json", {"kind": "sticky-markov-study", "config": to_dict(cfg),
                                              "runs": [plan.run_name(s, a) for s, a in plan.runs],
                                              "record_estimate_bytes": est,
                                              **({"resumed_from": {"study": plan.start["from"],
                                                                   "step": int(plan.start["ckpt"]["step"])}}
                                                 if plan.start else {})})


@dataclass
class _Data:
    """The chain and its sequences: per seed the training sequence (and held-out one) with the exact
    Bayes entropy per position, stacked in the batch order of the runs."""
    P: np.ndarray
    hmin: float
    train: dict                        # seed -> (sequence, H_Bayes per position)
    held: dict | None                  # seed -> (held-out sequence, H_Bayes), or None
    bayes_nll: dict[int, float]        # seed -> mean Bayes NLL (train seed s; held-out s + offset)
    dtype: torch.dtype
    x: torch.Tensor                    # (R, N, d_x) training inputs, per run
    y: torch.Tensor
    prev: torch.Tensor
    Hb: torch.Tensor
    ev: dict = field(default_factory=dict)        # the engine's held-out evaluation arguments
    Hb_ho: np.ndarray | None = None               # (R, N) held-out H_Bayes
    base_runs: list | None = None                 # per run: manifold metrics of the raw held-out x


def build_data(plan: _Plan) -> _Data:
    cfg, runs = plan.cfg, plan.runs
    P = transition_matrix(cfg.n_symbols, cfg.rho, cfg.construction, tuple(cfg.rho_range))
    pi = stationary(P) if cfg.construction == "graded" else None      # circulant chains: uniform
    hmin = h_min(P, pi)
    bayes_nll: dict[int, float] = {}

    def chain(seed):
        # H_Bayes = entropy of p(y_t | x_≤t), the HMM forward filter (the model sees the whole causal
        # prefix); its start law is the generator's uniform first symbol, for every construction
        d = generate(seed, cfg.T, cfg.n_symbols, cfg.d_x, P, cfg.embed_seed, cfg.noise_std)
        bayes_nll[seed] = float(filter_nll(d.x, d.mu, P, d.y, cfg.noise_std).mean())
        return d, filter_entropy(d.x, d.mu, P, cfg.noise_std).float()
    train = {s: chain(s) for s in cfg.seeds}
    dtype = torch.float64 if cfg.dtype == "float64" else torch.float32
    d = _Data(P, hmin, train, None, bayes_nll, dtype,
              x=torch.stack([train[s][0].x for s, _ in runs]).to(dtype),
              y=torch.stack([train[s][0].y for s, _ in runs]),
              prev=torch.stack([train[s][0].prev for s, _ in runs]),
              Hb=torch.stack([train[s][1] for s, _ in runs]))
    if cfg.heldout:
        d.held = {s: chain(s + cfg.heldout_offset) for s in cfg.seeds}
        _heldout_inputs(plan, d)
    return d


def _heldout_inputs(plan: _Plan, d: _Data) -> None:
    """The held-out sequences as the engine's evaluation batch, their H_Bayes and the raw-x baseline."""
    cfg, runs, held = plan.cfg, plan.runs, d.held
    d.Hb_ho = np.stack([held[s][1].numpy() for s, _ in runs])
    with threadpool_limits(1):          # the baseline (raw x) is the same at every step
        base_ho = {s: manifold_metrics(held[s][0].x.double().numpy(), held[s][1].numpy()) for s in cfg.seeds}
    d.base_runs = [base_ho[s] for s, _ in runs]
    d.ev = dict(eval_x=torch.stack([held[s][0].x for s, _ in runs]).to(d.dtype),
                eval_y=torch.stack([held[s][0].y for s, _ in runs]),
                eval_steps=lambda k: k % cfg.heldout_every == 0)


@dataclass
class _EngineArms:
    """The batched engine's per-run inputs: initial weights, learning rates, update mode."""
    W: object
    lrs: torch.Tensor
    modes: list[str]
    must_be_finite: torch.Tensor       # a grid LR may diverge


def build_arms(plan: _Plan) -> _EngineArms:
    cfg, runs = plan.cfg, plan.runs
    return _EngineArms(
        W=engine.init_weights([s for s, _ in runs], cfg.d_x, cfg.d_k, cfg.d_v, cfg.n_symbols, cfg.init_std),
        lrs=torch.tensor([a.lrs for _, a in runs]),
        modes=["em_closed_form" if a.arm == "em_closed_form" else "gd" for _, a in runs],
        must_be_finite=torch.tensor([a.arm != "sgd_grid" for _, a in runs]))


def _open_run(stack: ExitStack, plan: _Plan, data: _Data, study: Path, seed: int, a: Arm, rec_on: bool, tags):
    """One run directory (its writer, entered on ``stack``) and, if it stores arrays, its recorder."""
    cfg, rec_cfg = plan.cfg, plan.rec
    # value_lr_mult: the W_V multiplier this run really has (1 for sgd and the controls,
    # whose own multiplier is control_mult); lr_mult: the arm's multiplier on its groups
    run_cfg = {**to_dict(cfg), "seed": seed, "arm": a.arm, "lr_mult": a.mult,
               "value_lr_mult": a.mult if a.arm in ("em", "em_closed_form") else a.lrs[2] / cfg.lr,
               "lrs": dict(zip(engine.PARAMS, a.lrs)),
               "heldout_seed": seed + cfg.heldout_offset if cfg.heldout else None}
    w = stack.enter_context(RunWriter.create(study, "sticky-markov", run_cfg, name=plan.run_name(seed, a),
                                             seeds=[seed], tags=tags,
                                             extra_meta={"record_batch": "train (full batch)", "study": study.name,
                                                         "h_min": data.hmin, "metrics_rows": STATE_ROWS,
                                                         **sticky_resume.resumed_meta(plan.start, plan.run_name(seed, a))}))
    if not (rec_on and rec_cfg.enabled):
        return w, None
    seq, H = data.train[seed]
    st = w.open_store(rec_cfg.chunk_steps, rec_cfg.flush_seconds, attrs={"task": "sticky-markov"})
    st.write_static("targets", seq.y.numpy(), ("query",))
    st.write_static("prev_symbol", seq.prev.numpy(), ("query",))
    st.write_static("bayes_entropy", H.numpy(), ("query",))
    return w, Recorder(st, rec_cfg, cfg.steps + 1, plan.N)


class _Logging:
    """The engine's callbacks: recorded steps (arrays and diagnostics D1–D11, held-out geometry),
    held-out evaluations, and one metrics row per run per step; keeps what the summary needs."""

    def __init__(self, plan: _Plan, data: _Data, writers: list, recorders: list, bar):
        self.plan, self.data, self.writers, self.recorders, self.bar = plan, data, writers, recorders, bar
        self.prev_attn = None
        self.diag_rows: dict[int, list[dict]] = {}
        self.geometry: dict[int, list[dict]] = {}   # recorded step -> per run held-out manifold metrics
        self.eval_rows: dict[int, list[dict]] = {}
        self.heldout_curves: list[list[tuple[int, float]]] = [[] for _ in plan.runs]

    def record_steps(self) -> set[int]:
        return set().union(*(set(int(s) for s in r.steps) for r in self.recorders if r is not None))

    def on_step(self, step, state):
        """Recorded steps only: one chunked pass gives every recorded array and D1–D11."""
        rec, d = self.plan.rec, self.data
        want = [i for i, r in enumerate(self.recorders) if r is not None and r.wants(step)]
        # arrays only for the runs that store them; diagnostics for every run
        arrays, diag, self.prev_attn = step_record_threaded(
            state, tuple(rec.query_crop), tuple(rec.key_crop), rec.pool, d.prev, d.Hb, d.hmin,
            self.prev_attn, recorded=want, workers=torch.get_num_threads())
        rows = [{k: v[i].item() for k, v in diag.items()} for i in range(len(self.plan.runs))]
        if self.plan.cfg.heldout:
            extras = _heldout_manifold(state.weights, d.ev["eval_x"], d.Hb_ho, state.executor, d.base_runs)
            for i, extra in enumerate(extras):
                rows[i].update(extra)
            self.geometry[step] = [{k: v for k, v in r.items() if k.startswith("heldout_")} for r in rows]
        self.diag_rows[step] = rows
        for i, a in zip(want, arrays):
            self.recorders[i].write(step, a, extra=rows[i])

    def on_eval(self, step, m):
        rows = []
        for i in range(len(self.plan.runs)):
            row = {"heldout_loss": m["loss"][i].item(), "heldout_entropy": m["entropy"][i].item(),
                   "heldout_accuracy": m["accuracy"][i].item()}
            row["heldout_entropy_gap"] = row["heldout_entropy"] - self.data.hmin
            self.heldout_curves[i].append((step, row["heldout_loss"]))
            rows.append(row)
        self.eval_rows[step] = rows

    def on_metrics(self, step, m):
        """Every step: one metrics row per run (loss before the update), diagnostics merged in."""
        self.bar.update(1)
        diag = self.diag_rows.pop(step, None)
        evr = self.eval_rows.pop(step, None)
        for i, w in enumerate(self.writers):
            row = {"loss": m["loss"][i].item(), "entropy": m["entropy"][i].item(),
                   "accuracy": m["accuracy"][i].item()}
            row["entropy_gap"] = row["entropy"] - self.data.hmin
            w.log(step, **row, **(diag[i] if diag else {}), **(evr[i] if evr else {}))


def train_and_record(plan: _Plan, data: _Data, arms: _EngineArms, study: Path, tags, quiet: bool):
    """Train every run in one batch, each writing its own run directory; -> (result, logging).
    Stopped (time limit, stop_at_step, a signal): the study checkpoints and says how to go on."""
    cfg, t0 = plan.cfg, _time.perf_counter()
    with ExitStack() as stack:
        writers, recorders = [], []
        for (seed, a), rec_on in zip(plan.runs, plan.recorded):
            w, rec = _open_run(stack, plan, data, study, seed, a, rec_on, tags)
            writers.append(w)
            recorders.append(rec)
        bar = progress(total=cfg.steps + 1, desc=f"sticky-markov ({len(plan.runs)} runs)", disable=quiet)
        log = _Logging(plan, data, writers, recorders, bar)
        W, state, start = arms.W, None, 0
        if plan.start is not None:
            W, state, start = sticky_resume.restore(plan.start["ckpt"], len(plan.runs), log)
            bar.update(start)
        try:
            result = engine.train(data.x, data.y, W, arms.lrs, cfg.steps, causal=True, modes=arms.modes,
                                  kappa=cfg.kappa, ridge=cfg.ridge, on_step=log.on_step,
                                  record_steps=log.record_steps(), on_metrics=log.on_metrics,
                                  check_finite=arms.must_be_finite,
                                  on_eval=log.on_eval if cfg.heldout else None, **data.ev,
                                  start=start, resume=state, stop=sticky_resume.stop_rule(cfg, t0, start))
        except KeyboardInterrupt as e:           # Ctrl-C / SIGTERM between two steps: a checkpoint
            if getattr(e, "stopped", None) is not None:
                sticky_resume.save(study, e.stopped, log, e.stopped.stopped_at)
                e.next_step = sticky_resume.say_stopped(study, [], e.stopped.stopped_at)
            raise
        finally:
            bar.close()
        sticky_resume.save(study, result, log, cfg.steps if result.stopped_at is None else result.stopped_at)
        if result.stopped_at is not None:
            sticky_resume.say_stopped(study, writers, result.stopped_at)
            return result, log
        for i, w in enumerate(writers):
            final = {k: float(v[i]) for k, v in result.final.items()}
            fe = {f"heldout_{k}": float(v[i]) for k, v in (result.final_eval or {}).items()}
            w.update_meta(final={"steps": cfg.steps, "final_loss": final["loss"], "entropy": final["entropy"],
                                 "accuracy": final["accuracy"], **fe})
    return result, log


def _validation_loss(plan: _Plan, data: _Data, result) -> np.ndarray:
    """sgd_tuned picks on a third sequence per seed: final weights, forward only (NaN: diverged)."""
    cfg, runs = plan.cfg, plan.runs
    val = {s: generate(s + cfg.validation_offset, cfg.T, cfg.n_symbols, cfg.d_x, data.P, cfg.embed_seed,
                       cfg.noise_std) for s in cfg.seeds}
    vx = torch.stack([val[s].x for s, _ in runs]).to(data.dtype)
    vy = torch.stack([val[s].y for s, _ in runs])
    vl = engine.evaluate(result.weights, vx, vy)["loss"]
    return vl.masked_fill(~torch.isfinite(result.final["loss"]), float("nan")).numpy()


def write_summary(plan: _Plan, data: _Data, result, log: _Logging, study: Path) -> None:
    cfg = plan.cfg
    bayes = {"rule": "mean over positions of -log p(y_t | x_<=t), HMM forward filter (Bayes-optimal causal loss)",
             "per_seed": [{"seed": s, "train": data.bayes_nll[s],
                           "heldout": data.bayes_nll.get(s + cfg.heldout_offset) if cfg.heldout else None}
                          for s in cfg.seeds],
             "h_bayes": _entropy_stats(data.train, data.held if cfg.heldout else None, data.hmin)}
    validation = _validation_loss(plan, data, result) if plan.grid else None
    summary = summarise(cfg, plan.runs, result, data.hmin, log.heldout_curves, plan.grid, bayes=bayes,
                        validation=validation)
    if log.geometry:
        summary["geometry"] = geometry_summary(cfg, plan.runs, log.geometry, GEOMETRY_KEYS)
    write_json_atomic(study / "summary.json", summary)


def run_study(cfg: StickyConfig, out_dir: str, name: str | None = None, tags: list[str] | None = None,
              quiet: bool = False, start: dict | None = None) -> Path:
    """Run the study into ``out_dir/name`` (``start``: a stopped study's checkpoint to continue,
    :func:`.sticky_resume.load`); summary.json once every step is taken, else study.json's
    ``next_step`` says how to go on."""
    if not open_backend(out_dir, "--out").plain_files:      # the study folder holds plain files (summary, figures)
        raise RunError(f"--out {out_dir}: a sticky-markov study is written to a local folder "
                       "(single runs, `sim toy`, `sim bijection` and `train`, can go to object storage)")
    cfg.check_memory()                                       # before any folder is made
    out = ensure_out_dir(out_dir)
    study = out / (name or f"study-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}")
    if study.exists():
        raise RunError(f"study {study} already exists; choose another --name (nothing is overwritten)")
    plan = replace(plan_study(cfg), start=start)             # config, resolved into a copy
    _open_study(plan, out, study)
    data = build_data(plan)                                  # data
    arms = build_arms(plan)                                  # arms
    result, log = train_and_record(plan, data, arms, study, tags, quiet)   # train + record
    if result.stopped_at is not None:
        return study
    write_summary(plan, data, result, log, study)            # summary
    return study
