"""What every study does per arm: a fresh study folder (never overwriting one) and one training run
in it that may diverge without stopping the study.  Shared by :mod:`.studies` and :mod:`.ls_logits`."""
from __future__ import annotations

import datetime as _dt
import secrets
from pathlib import Path

from ..errors import NonFiniteLossError, RunError


def train_arm(study_dir: Path, name: str, cfg, quiet, tags):
    from ..run import open_run
    from .runner import run_training
    if not quiet:
        print(f"[{tags[0]}] {name}", flush=True)
    try:
        run_training(cfg, str(study_dir), name=name, tags=tags, quiet=quiet)
    except NonFiniteLossError:
        pass                                          # the run is marked failed; the study goes on
    return open_run(study_dir / name)


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
