"""What ``train --resume`` takes from the run it resumes, beyond its config: that it is a training
run at all, and which WikiText it read (the folder its first part read, as its meta.json records).

A run started with ``$DYNTOOL_WIKITEXT`` (or the shared copy, or the hub's cached snapshot) has an
empty ``data.path`` in its config.json, so a resume from a new shell would look for the data all
over again (and, on a machine without the shared copy, wait for the hub); meta.json's
``data_path`` says where the tokens came from, and that is what the checkpoint's vocabulary needs.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .. import safeio
from ..errors import RunError
from ..storage import open_backend
from .config import TrainConfig


def check_trainable(resume: str) -> None:
    """A run that ``dyntool train`` did not write (a simulation: its config has no ``train``
    section) is refused by what it is; its config would otherwise fail as "unknown key steps"."""
    run = open_backend(resume, "--resume", root="/")
    try:
        config = safeio.loads(run.get("config.json", safeio.MAX_JSON_BYTES) or b"{}", "config.json")
        meta = safeio.loads(run.get("meta.json", safeio.MAX_JSON_BYTES) or b"{}", "meta.json")
    except (OSError, ValueError):          # load_config says what is wrong with a damaged run
        return
    if isinstance(config, dict) and config and "train" not in config:
        kind = meta.get("kind", "?") if isinstance(meta, dict) else "?"
        study = os.path.dirname(os.path.normpath(str(resume)))    # the studies' runs continue with their study
        how = (f"continue it with: dyntool sim {kind} --resume {resume}" if kind in ("toy", "bijection") else
               f"continue its study with: dyntool sim {kind} --resume {study}" if kind in ("sticky-markov", "icl-markov")
               else "a simulation without a checkpoint: its own command starts it again")   # dyntool/sims/resume.py
        raise RunError(f"cannot resume {resume}: it is a {kind!r} run, not one `dyntool train` wrote; {how}")


def use_recorded_data(cfg: TrainConfig, run) -> None:
    """Set ``cfg.data.path`` to the folder ``run``'s meta.json records, when the config left the
    data to the default search (an explicit ``--data.path`` on the resume command wins) and that
    folder is still there; otherwise leave the default search to it, and say why."""
    if cfg.data.path:
        return
    try:
        meta = safeio.loads(run.get("meta.json", safeio.MAX_JSON_BYTES) or b"{}", "meta.json")
    except (OSError, ValueError):          # the checkpoint check reports a damaged run; not this
        return
    recorded = meta.get("data_path") if isinstance(meta, dict) else None
    if not isinstance(recorded, str) or not recorded:
        return
    if Path(recorded).is_dir():
        cfg.data.path = recorded
    else:
        print(f"dyntool: warning: the run read its data from {recorded}, which is not a folder here; "
              f"looking for WikiText as a new run would (--data.path=DIR chooses one)", file=sys.stderr)
