"""``dyntool sim sticky-markov --resume STUDY``: checkpoints of the sticky-chain study.

Every (seed, arm) run trains in one batched engine (:mod:`.single_head`), so the study is the unit
that stops and goes on: ``STUDY/checkpoint.pt`` (written by :mod:`.resume`'s mechanism on Ctrl-C or
SIGTERM, between two steps; when ``time_limit_min`` or ``stop_at_step`` stops it; at the end) holds
the R-batched weights, the learning rates (a diverged grid run's are 0), which runs diverged, the
loss curves so far and what the summary collects on the way (held-out curves, geometry, the last
recorded crop of attention).  ``--resume STUDY`` makes a new study ``STUDY-resumeSTEP`` beside it,
each run ``seed{S}-{arm}`` logging from that step on; its summary.json and rows are those of the
study that never stopped (tests/integration/test_sim_resume_studies.py).  The data are rebuilt from
the config (no RNG draws during training)."""
from __future__ import annotations

import json
import time
from pathlib import Path

from .. import config as _config
from ..errors import RunError
from ..storage import open_backend
from ..train import checkpoint
from . import resume as ckpt
from . import single_head as engine
from .sticky_config import StickyConfig

KIND = "sticky-markov"
NO_OPTIM = {"state": {}, "param_groups": []}      # plain gradient steps: the learning rates are in extra


def load(path: str, overrides: list[str] | None, values: dict | None) -> tuple[StickyConfig, dict | None]:
    """(config, start) of ``--resume STUDY``: study.json's config (``stop_at_step`` reset) ← overrides,
    and {ckpt, from, out, name}; start None when the checkpoint is at ``steps`` already (said here)."""
    p = Path(path)
    try:
        raw = json.loads((p / "study.json").read_text())
    except (OSError, ValueError):
        raise RunError(f"cannot resume {path}: not a sticky-markov study folder (no readable study.json)") from None
    kind = str(raw.get("kind", "unknown")) if isinstance(raw, dict) else "unknown"
    if kind != "sticky-markov-study" or not isinstance(raw.get("config"), dict):
        raise RunError(f"cannot resume {path}: it is a {kind.removesuffix('-study')} study, not sticky-markov")
    sd = ckpt.read(open_backend(p, "--resume", root="/"), p, path, KIND)
    cfg = _config.load(StickyConfig, base={**raw["config"], "stop_at_step": 0}, overrides=overrides, values=values)
    if sd["step"] >= cfg.steps:
        print(f"dyntool: {path} is already at step {sd['step']} = steps: nothing to do "
              f"(to train on, pass --steps N with N > {sd['step']})")
        return cfg, None
    return cfg, {"ckpt": sd, "from": str(p.resolve()), "out": str(p.parent), "name": ckpt.beside(p.resolve(), sd["step"])}


def resumed_meta(start: dict | None, run: str) -> dict:
    """A resumed study's run ``run``: the run it continues, for its meta.json."""
    if start is None:
        return {}
    return {"resumed_from": {"run": str(Path(start["from"]) / run), "step": int(start["ckpt"]["step"])}}


def restore(sd: dict, n_runs: int, log) -> tuple[engine.Weights, engine.TrainResult, int]:
    """The engine's weights and resume state from a checkpoint, the logger's carried state set;
    -> (weights, resume, step)."""
    ex = sd["extra"]
    try:
        W = engine.Weights(**{n: sd["model"][n] for n in engine.PARAMS})
        state = engine.TrainResult(ex["losses"], W, None, lrs=ex["lrs"], dead=ex["dead"])
        ok = all(t.shape[0] == n_runs for t in (W.W_Q, state.losses, state.lrs, state.dead))
    except (KeyError, TypeError, AttributeError):
        ok = False
    if not ok:
        raise RunError("the checkpoint can't be restored into this config's runs; a resumed study keeps its "
                       "seeds, arms and sizes")
    log.prev_attn, log.geometry = ex.get("prev_attn"), {int(k): v for k, v in ex["geometry"].items()}
    log.heldout_curves = [[tuple(p) for p in c] for c in ex["heldout_curves"]]
    return W, state, int(sd["step"])


def save(study: Path, res: engine.TrainResult, log, step: int) -> None:
    """STUDY/checkpoint.pt at ``step`` updates taken (atomically, as every sim's)."""
    extra = {"lrs": res.lrs, "dead": res.dead, "losses": res.losses[:, :step].contiguous(),
             "prev_attn": log.prev_attn, "geometry": log.geometry,
             "heldout_curves": [list(c) for c in log.heldout_curves]}
    checkpoint.save(ckpt.tree(KIND, step, dict(res.weights.as_dict()), NO_OPTIM, {}, extra), study / ckpt.FILE)


def say_stopped(study: Path, writers: list, step: int) -> str:
    """A stopped study: every run's meta and study.json say how to go on; -> that line."""
    line = ckpt.continue_command(KIND, study, step)
    for w in writers:
        w.update_meta(final={"steps_done": step, "stopped_early": True, "next_step": line})
    ckpt.set_next_step(study, line)
    return line


def stop_rule(cfg: StickyConfig, t0: float, start: int):
    """stop(step): the time limit (before a step begun past it; a call's first step is always taken,
    so each call gets somewhere) or stop_at_step."""
    def stop(step: int) -> bool:
        return (0 < cfg.stop_at_step == step) or \
            (cfg.time_limit_min > 0 and step > start and time.perf_counter() - t0 > 60 * cfg.time_limit_min)
    return stop

