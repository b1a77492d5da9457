"""Wind-tunnel benchmark: what the Paper-I analyses cost relative to training, in one process.

Times (median of repeats, same process, same model) for the ``cpu`` preset's model
(dyntool/presets/bijection.toml): one training step (reference), one held-out evaluation, one recorded
step's analyses (:func:`dyntool.sims.bijection_analysis.analyze`) and one seam recording of the
probe; then the share of a run's time they take under the preset's schedule (target: the
analyses and evaluations together add at most 25 % to the training time).

    python bench/bench_bijection.py [--quick]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

from common import hardware, median_time

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dyntool import config  # noqa: E402
from dyntool.record.policy import schedule  # noqa: E402
from dyntool.recorder import Recorder  # noqa: E402
from dyntool.record.store_writer import StoreWriter  # noqa: E402
from dyntool.sims import bijection_data as data  # noqa: E402
from dyntool.sims.bijection import BijectionConfig, build_model, heldout  # noqa: E402
from dyntool.sims.bijection_analysis import analyze, evaluate, value_loss  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cfg = config.load(BijectionConfig, "bijection", "cpu")
    if cfg.threads:                          # as the run does: torch and BLAS threads
        torch.set_num_threads(cfg.threads)
        from threadpoolctl import threadpool_limits
        threadpool_limits(cfg.threads)
    rep = 3 if args.quick else 10
    model = build_model(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
    g = torch.Generator().manual_seed(0)
    tok, tgt = heldout(cfg)
    h = data.posterior_entropy(tok.numpy(), cfg.V)

    def train_step():
        x, y = data.sample(cfg.batch_size, cfg.V, cfg.L, g)
        loss = value_loss(model(x)[0], y, cfg.V)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    t_train = median_time(train_step, repeat=5 * rep, warmup=3)
    t_eval = median_time(lambda: evaluate(model, tok, tgt, cfg.V), repeat=rep)
    an_tok, an_h = tok[:cfg.analysis_seqs], h[:cfg.analysis_seqs]
    t_an = median_time(lambda: analyze(model, an_tok, cfg.V, n_plot=cfg.plot_seqs, h_bayes=an_h), repeat=rep)
    with tempfile.TemporaryDirectory() as d:
        store = StoreWriter(Path(d) / "r.zarr")
        rec = Recorder(store, cfg.record, 10 ** 6, data.seq_len(cfg.L))
        pr, pt = tok[:cfg.record.seqs], tgt[:cfg.record.seqs]
        step = iter(range(10 ** 6))
        t_rec = median_time(lambda: rec.record_probe(model, lambda m: value_loss(m(pr)[0], pt, cfg.V),
                                                     next(step)), repeat=rep)
        store.close()
    n_rec = len(schedule(cfg.record, cfg.steps))
    n_eval = len(set(range(0, cfg.steps, cfg.eval_every)) | set(int(s) for s in schedule(cfg.record, cfg.steps)))
    train_total = cfg.steps * t_train
    extra = n_rec * (t_an + t_rec) + n_eval * t_eval
    print(f"hardware: {hardware()}")
    print(f"model {cfg.model.n_layer}x{cfg.model.n_head}x{cfg.model.n_embd}, batch {cfg.batch_size}")
    print(f"training step (reference)           {t_train * 1e3:8.1f} ms   1.00x")
    print(f"held-out evaluation ({cfg.heldout_seqs} seqs)    {t_eval * 1e3:8.1f} ms   {t_eval / t_train:5.1f}x")
    print(f"analyses ({cfg.analysis_seqs} seqs)                {t_an * 1e3:8.1f} ms   {t_an / t_train:5.1f}x")
    print(f"seam recording ({cfg.record.seqs} probe seqs)      {t_rec * 1e3:8.1f} ms   {t_rec / t_train:5.1f}x")
    share = extra / train_total
    print(f"preset schedule: {n_rec} recorded + {n_eval} evaluated steps over {cfg.steps}: "
          f"+{100 * share:.1f} % of the training time (target <= 25 %): {'PASS' if share <= 0.25 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
