"""What every study does per arm: a fresh study folder (never overwriting one) and one training run
in it that may diverge without stopping the study.  Shared by :mod:`.studies` and :mod:`.ls_logits`."""
from __future__ import annotations

import datetime as _dt
import secrets
import shlex
from pathlib import Path

from ..errors import NonFiniteLossError, RunError


def train_arm(study_dir: Path, name: str, cfg, quiet, tags, callbacks=None):
    # deferred: keeps torch and zarr off `dyntool info STUDY` (the study's table imports ls_logits or
    # span_study, which import this module)
    from ..run import open_run
    from .runner import run_training
    if not quiet:
        print(f"[{tags[0]}] {name}", flush=True)
    try:
        run_training(cfg, str(study_dir), name=name, tags=tags, quiet=quiet, callbacks=callbacks)
    except NonFiniteLossError:
        pass                                          # the run is marked failed; the study goes on
    except KeyboardInterrupt as e:                    # the study says how to go on (continue_study)
        e.study_dir, e.study_seed = study_dir, cfg.seed
        raise
    return open_run(study_dir / name)


def continue_study(e: KeyboardInterrupt, which: str, seeds: list[int], max_steps, preset, overrides,
                   out: str, arms: list[str] | None = None) -> str:
    """What an interrupted study prints: where it stopped and the command that runs the seeds it
    did not finish (a study has no checkpoints to resume: the seed that was running starts again,
    into a new study folder; the finished runs stay where they are)."""
    d, seed = getattr(e, "study_dir", None), getattr(e, "study_seed", None)
    if d is None or seed not in seeds:
        return "the study stopped before its first run"
    rest = seeds[seeds.index(seed):]
    cmd = ["dyntool", "study", which, "--seeds", ",".join(map(str, rest))]
    cmd += ["--max-steps", str(max_steps)] if max_steps else []
    cmd += ["--arms", ",".join(arms)] if arms else []
    cmd += ["--preset", preset] if preset else []
    cmd += ["--out", out, *overrides]
    done = len(seeds) - len(rest)
    return (f"study {d} stopped in seed {seed} ({done} of {len(seeds)} seeds finished, kept there); "
            f"continue the remaining seeds with: {shlex.join(cmd)}")


def new_study_dir(out: str, which: str, name: str | None) -> Path:
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    d = Path(out) / (name or f"{which}-{stamp}-{secrets.token_hex(2)}")
    try:
        d.mkdir(parents=True)
    except FileExistsError:
        raise RunError(f"study {d} already exists; choose another --name (nothing is overwritten)") from None
    except OSError as e:
        raise RunError(f"study directory {d} can't be created: {e.strerror or e}") from None
    return d
