"""``dyntool sim icl-markov --resume STUDY``: a study stopped by Ctrl-C/SIGTERM, its time limit or
``stop_at_step`` goes on in the next call.  Each run checkpoints as every sim does
(:mod:`.resume`); a stopped run's continuation is a new run ``RUN-resumeSTEP`` in the study
folder, and a run may be continued more than once, so each (seed, prior) is a *chain* of run
folders, oldest first, each resumed from the one before (its ``meta.resumed_from``).  Resuming the
study walks its runs in order: a chain that reached ``steps`` is skipped (analysed from its rows),
the one that stopped continues from its checkpoint, the runs not begun start; the summary is
written when every run is done.  The chain's rows together are the uninterrupted run's
(tests/integration/test_sim_resume_studies.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from .. import config as _config
from ..errors import RunError
from ..run import open_run
from . import resume as ckpt
from .icl_markov_config import ICLMarkovConfig

KIND = "icl-markov"


def _meta(path: Path) -> dict:
    try:
        return json.loads((path / "meta.json").read_text())
    except (OSError, ValueError):
        return {}


def chain(study: Path, name: str) -> list[Path]:
    """The run folders of one (seed, prior), oldest first ([] when it has not begun)."""
    cur = study / name
    if not cur.exists():
        return []
    out = [cur]
    while True:
        nxt = [d for d in study.glob(f"{cur.name}-resume*") if d.is_dir() and
               Path((_meta(d).get("resumed_from") or {}).get("run", "")).resolve() == cur.resolve()]
        if not nxt:
            return out
        cur = max(nxt, key=lambda d: (d / "meta.json").stat().st_mtime)
        out.append(cur)


def steps_done(links: list[Path]) -> int:
    """How far a chain got: its last run's final.steps_done (0 if it never finished a step)."""
    return int((_meta(links[-1]).get("final") or {}).get("steps_done", 0)) if links else 0


def metrics(links: list[Path]) -> pd.DataFrame:
    """The chain's metrics rows: each run's rows before the step its continuation starts at."""
    frames = []
    for i, p in enumerate(links):
        df = open_run(p).metrics
        if i + 1 < len(links):
            df = df[df.step < int(_meta(links[i + 1])["resumed_from"]["step"])]
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if len(frames) > 1 else frames[0]


def seconds(links: list[Path]):
    got = [(_meta(p).get("final") or {}).get("seconds") for p in links]
    return None if None in got else round(sum(got), 1)


def continue_run(links: list[Path]) -> tuple[dict, str, str]:
    """(checkpoint, new run name, its run path as resumed_from) of a chain's stopped last run."""
    _, sd, name, _ = ckpt.load(str(links[-1]), KIND)
    return sd, name, str(links[-1])


def load_study(path: str, overrides: list[str] | None, values: dict | None) -> tuple[Path, ICLMarkovConfig]:
    """``--resume STUDY`` (or one of its runs): the study folder and its config (study.json's, with
    ``stop_at_step`` reset, ← overrides).  One-line :class:`RunError` for anything else."""
    p = Path(path)
    if not (p / "study.json").is_file() and (p.parent / "study.json").is_file() and (p / "meta.json").is_file():
        p = p.parent                                   # a run of the study: its study
    if not (p / "study.json").is_file():
        raise RunError(f"cannot resume {path}: not an icl-markov study folder (no study.json)")
    try:
        raw = json.loads((p / "study.json").read_text())
    except (OSError, ValueError) as e:
        raise RunError(f"cannot resume {path}: study.json unreadable ({type(e).__name__})") from None
    if not isinstance(raw, dict) or raw.get("kind") != "icl-markov-study" or not isinstance(raw.get("config"), dict):
        kind = str(raw.get("kind", "unknown")) if isinstance(raw, dict) else "unknown"
        raise RunError(f"cannot resume {path}: it is a {kind.removesuffix('-study')} study, not icl-markov")
    base = {**raw["config"], "stop_at_step": 0}
    return p, _config.load(ICLMarkovConfig, base=base, overrides=overrides, values=values)
