"""Cached, marker-bounded reads of runs for the app, through the core reader (:mod:`dyntool.run`,
:class:`dyntool.record.reader.RecordReader`).

* Every path comes from :func:`runs_root` + :func:`resolve_inside` (``..``, absolute paths, NUL
  bytes and symlinks out are refused), and every run is opened with ``root=RUNS_DIR``, so no
  file (meta.json, config.json, metrics.jsonl, record.zarr, a chunk) resolving outside RUNS_DIR
  is ever read.
* Store handles live in ``st.cache_resource`` keyed by ``(run path, marker)`` and are *bounded*
  at that marker: a slice labelled with marker M holds exactly M rows even when the writer has
  committed more since.  Small slices live in ``st.cache_data`` keyed by path + marker + slice.
* Nothing is unpickled (JSON and zarr only); a corrupt chunk is a :class:`RecordError` message.
"""
from __future__ import annotations

import html
import os
import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import streamlit as st

from dyntool.app import analysis
from dyntool.errors import RunError
from dyntool.location import URLPath, location
from dyntool.record.ranks import open_record
from dyntool.record.store import RecordError, read_marker
from dyntool.run import RECORD_DIR, Run, find_runs, open_run
from dyntool.steps import steps_taken
from dyntool.storage import Outside, open_backend

ENV_ROOT = "DYNTOOL_RUNS_DIR"
MAX_DEPTH = 3
MAX_STATIC = 1_000_000       # elements: larger static arrays are listed but not loaded


class AppInputError(Exception):
    """Something about the input the user should read, shown as a message (never a traceback)."""


def esc(text) -> str:
    """A string from a run's files (or any message quoting one) as plain text inside Streamlit
    Markdown: every ASCII punctuation character is backslash-escaped, so no link, image, emphasis,
    directive (``:red[...]``, ``:material/...:``), HTML or LaTeX in it takes effect; newlines
    become spaces.  A bare URL would still become a link (GFM links ``http://`` and ``www.`` found
    in the parsed text, escapes or not), so an invisible word joiner goes before each: GFM only
    links a URL that starts a word."""
    s = " ".join(str(text).splitlines())
    s = re.sub(r"(?i)(https?://|www\.)", "\u2060\\1", s)
    return re.sub(r"([!-/:-@\[-`{-~])", r"\\\1", s)


def label(text) -> str:
    """A string from a run's files as plain text inside a plotly title, legend or tick label
    (plotly reads ``<a href>``, ``<b>`` and entities in them)."""
    return html.escape(str(text), quote=False)


# ---------------------------------------------------------------------------------------
# where runs live
# ---------------------------------------------------------------------------------------

def runs_root() -> Path | URLPath:
    """RUNS_DIR: ``$DYNTOOL_RUNS_DIR`` (set by ``dyntool app``), else ``streamlit run main.py -- DIR``,
    else ``./runs``; resolved, so every later containment check compares real paths.  An
    object-store URL (``s3://``, ``file://``) stays a URL: its runs are read, never written."""
    raw = os.environ.get(ENV_ROOT)
    if not raw and len(sys.argv) > 1 and sys.argv[0].endswith("main.py"):
        raw = sys.argv[1]
    return location(raw or "runs", "RUNS_DIR").resolve()


def resolve_inside(root: Path | URLPath, rel: str | Path) -> Path | URLPath:
    """``root / rel`` as its backend reaches it (:meth:`dyntool.storage.Backend.below`); raises
    :class:`AppInputError` if it escapes ``root`` or is not a path."""
    if "\x00" in str(rel):
        raise AppInputError("a folder name can't contain a NUL byte")
    try:
        return open_backend(root, "RUNS_DIR").below(rel)
    except Outside:
        raise AppInputError(f"'{rel}' is outside the runs directory {root}; only paths inside it can be opened") from None
    except (OSError, ValueError) as e:
        raise AppInputError(f"'{rel}' is not a usable path ({e})") from None


def rel(root: Path | URLPath, path: Path | URLPath | str) -> str:
    p = location(path) if isinstance(path, str) else path
    return "." if p == root else str(p.relative_to(root))


def parent_of(path: str) -> str:
    """The folder holding a run (its study), as text, for a local path or a URL alike."""
    return str(location(path).parent)


@st.cache_data(ttl=3, show_spinner=False)
def discover(root: str, sub: str = "") -> list[str]:
    """Runs below ``root/sub`` (study directories included) as paths relative to ``root``, found by
    :func:`dyntool.run.find_runs` (which skips folders resolving outside ``root``), each by its real
    location.  Re-listed at most every 3 s."""
    base = location(root, "RUNS_DIR")
    start = resolve_inside(base, sub)
    if not open_backend(start).is_dir():
        raise AppInputError(f"'{sub or start}' is not a directory inside {base}")
    try:
        return sorted(rel(base, found.resolve()) for found in find_runs(start, MAX_DEPTH, root=base))
    except RunError as e:
        raise AppInputError(str(e)) from None


# ---------------------------------------------------------------------------------------
# run handles
# ---------------------------------------------------------------------------------------

def backend(path: str):
    """The storage backend of ``path`` (a run or a study folder); no file resolving outside
    RUNS_DIR is read through it."""
    return open_backend(path, root=runs_root())


def signature(path: str) -> tuple:
    """Cheap change detector of meta.json, metrics.jsonl and the record's zarr.json: their
    backend's signature (a stat each on a disk, nothing read; in object storage, where a stat is a
    request, the clock, so a remote run is re-read at most every few seconds)."""
    return backend(path).signature(("meta.json", "metrics.jsonl", f"{RECORD_DIR}/zarr.json"))


@st.cache_resource(max_entries=64, show_spinner=False)
def _reader(path: str, mark: int | None):
    """A record reader bounded at ``mark`` committed steps (None: at the marker it finds): every
    rank's, merged; None when the run has no recording."""
    try:
        return open_record(backend(path), limit=mark)
    except RunError as e:
        raise AppInputError(f"the recording can't be read: {e}") from None


def marker(path: str) -> int:
    """Committed steps the app may read: the core's commit marker, bounded by the data it finds
    (a marker past the data is a problem of the run, and nothing past the data is read); read
    again only when the run's :func:`signature` changes."""
    return _marker(path, signature(path))


@st.cache_data(max_entries=256, show_spinner=False)
def _marker(path: str, sig: tuple) -> int:
    """The marker a run has now (the group metadata only), then the reader bounded at it."""
    try:
        r = _reader(path, read_marker(backend(path), RECORD_DIR))
    except (RunError, AppInputError):
        return 0
    return r.steps_written if r is not None else 0


def reader(path: str, mark: int | None = None):
    return _reader(path, marker(path) if mark is None else mark)


@st.cache_resource(max_entries=64, show_spinner=False)
def _open_run(path: str, sig: tuple) -> Run:
    try:
        return open_run(path, root=runs_root())
    except RunError as e:
        raise AppInputError(str(e)) from None


def get_run(path: str) -> Run:
    """The :class:`dyntool.run.Run` at ``path`` (files outside RUNS_DIR refused), re-opened when
    its files change."""
    return _open_run(path, signature(path))


def _array(path: str, mark: int, name: str):
    r = reader(path, mark)
    if r is None:
        raise AppInputError("this run has no recording (record.zarr is missing)")
    if name not in r.names():
        raise AppInputError(f"this run did not record '{name}' (recorded: {', '.join(r.names()) or 'nothing'})")
    return r[name]


# ---------------------------------------------------------------------------------------
# small cached reads
# ---------------------------------------------------------------------------------------

@st.cache_data(max_entries=512, show_spinner=False)
def summary(path: str, sig: tuple) -> dict:
    """One row of the runs table; ``status`` is ``corrupt`` when anything can't be read as written
    (the run's own status is kept in ``meta status``)."""
    run = get_run(path)
    m = run.meta
    df = run.metrics
    final: dict = {}
    for col in ("loss", "val_loss", "val_ppl", "accuracy", "entropy"):
        if col in df.columns and df[col].notna().any():
            final[col] = float(df[col].dropna().iloc[-1])
    return {"kind": run.kind, "status": "corrupt" if run.corrupt else run.status, "meta status": run.status,
            "tags": list(m.get("tags", [])), "created": m.get("created", ""),
            "steps": steps_taken(m, df),
            "recorded": marker(path), "size_mb": run.size_bytes() / 2**20,
            **{f"final {k}": v for k, v in final.items()},
            "problems": list(run.problems) + list(run.notes)}


@st.cache_data(max_entries=64, show_spinner=False)
def metrics(path: str, sig: tuple) -> pd.DataFrame:
    df = get_run(path).metrics
    if "step" in df.columns:
        df = df.sort_values("step").drop_duplicates("step", keep="last").reset_index(drop=True)
    return df


@st.cache_data(max_entries=128, show_spinner=False)
def array_info(path: str, mark: int) -> dict:
    """``{"arrays": {name: {dims, shape, dtype, attrs}}, "attrs": group attrs, "static": {name: shape},
    "problems": [...]}`` (the readable arrays; the problems of the rest)."""
    out: dict = {"arrays": {}, "attrs": {}, "static": {}, "problems": []}
    try:
        r = reader(path, mark)
    except AppInputError as e:
        out["problems"].append(str(e))
        return out
    if r is None:
        return out
    out["problems"] += r.problems
    out["attrs"] = dict(r.attrs)
    for n, a in r.arrays().items():
        out["arrays"][n] = {"dims": tuple(a.dims), "shape": tuple(a.shape), "dtype": str(a.dtype),
                            "attrs": dict(a.attrs)}
    try:
        out["static"] = r.static_shapes()
    except RecordError as e:
        out["problems"].append(str(e))
    return out


@st.cache_data(max_entries=128, show_spinner=False)
def steps(path: str, mark: int) -> np.ndarray:
    """Training step of each recorded index (length = the commit marker)."""
    return np.asarray(_array(path, mark, "step")[:], dtype=np.int64)


@st.cache_data(max_entries=2048, show_spinner=False)
def matrix(path: str, mark: int, name: str, idx: int, layer: int, head: int, seq: int = 0,
           rows: tuple[int, int] | None = None, cols: tuple[int, int] | None = None) -> np.ndarray:
    """One head's (query, key) matrix at recorded index ``idx``; ``rows``/``cols`` are [start, stop)
    in array coordinates (None: all).  Reads only the chunks that hold it."""
    a = _array(path, mark, name)
    r = slice(*rows) if rows else slice(None)
    c = slice(*cols) if cols else slice(None)
    return np.asarray(a[idx, layer, head, seq, r, c], dtype=np.float32)


@st.cache_data(max_entries=512, show_spinner=False)
def pooled(path: str, mark: int, name: str, idx: int, layer: int, head: int, seq: int, block: int) -> np.ndarray:
    """Block-mean overview of a recorded matrix (used when no ``*_pooled`` array was recorded), over
    the visible entries as the recorder pools: masked α, B, A, ∂L/∂s are stored as 0, so the mask
    is read from the recorded ``scores`` (NaN where masked); without scores, the finite entries."""
    m = matrix(path, mark, name, idx, layer, head, seq)
    visible = None
    if "scores" in array_info(path, mark)["arrays"]:
        s = m if name == "scores" else matrix(path, mark, "scores", idx, layer, head, seq)
        visible = ~np.isnan(s) if s.shape == m.shape else None      # ±inf: a float16 overflow, visible
    return analysis.block_mean(m, block, visible)


@st.cache_data(max_entries=256, show_spinner=False)
def head_series(path: str, mark: int, name: str) -> np.ndarray:
    """(steps, layer, head) curve of a recorded array: the array itself for per-head scalars
    (``logit_max``), else its mean over the trailing axes, read a few steps at a time."""
    a = _array(path, mark, name)
    if len(a.shape) < 3:
        raise AppInputError(f"'{name}' is not per layer and head (dims {a.dims})")
    if len(a.shape) == 3:
        return np.asarray(a[:], dtype=np.float64)
    per = int(np.prod(a.shape[1:]))
    chunk = max(1, min(len(a), 2**24 // max(per, 1)))
    parts = []
    for i in range(0, len(a), chunk):
        x = np.asarray(a[i:i + chunk], dtype=np.float32)
        parts.append(np.nanmean(x.reshape(*x.shape[:3], -1), axis=-1))
    return np.concatenate(parts) if parts else np.zeros((0, *a.shape[1:3]))


@st.cache_data(max_entries=64, show_spinner=False)
def vectors(path: str, mark: int, name: str, layer: int, head: int, seq: int, idx: tuple[int, ...]) -> np.ndarray:
    """(len(idx), positions, d) vectors of one head at the given recorded indices."""
    a = _array(path, mark, name)
    return np.stack([np.asarray(a[i, layer, head, seq], dtype=np.float32) for i in idx])


@st.cache_data(max_entries=64, show_spinner=False)
def head_outputs(path: str, mark: int, layer: int, head: int, seq: int, idx: tuple[int, ...]) -> np.ndarray:
    """(len(idx), recorded queries, d_v) head outputs g_i = Σ_j α_ij v_j, from ``attn`` (over its
    key crop) and ``values``; exact when the key crop holds every key the queries can see."""
    a, v = _array(path, mark, "attn"), _array(path, mark, "values")
    k0 = int(a.attrs.get("key_offset", 0))
    out = [analysis.head_outputs(np.asarray(a[i, layer, head, seq], dtype=np.float32)[None],
             np.asarray(v[i, layer, head, seq], dtype=np.float32)[None], k0)[0] for i in idx]
    return np.stack(out)


@st.cache_data(max_entries=64, show_spinner=False)
def static(path: str, mark: int) -> dict[str, np.ndarray]:
    """Small numeric arrays of ``record.zarr/static`` (no step axis), e.g. ``bayes_entropy``,
    ``targets``; unreadable ones are left out (and reported by the run's problems)."""
    try:
        r = reader(path, mark)
    except AppInputError:
        return {}
    out: dict[str, np.ndarray] = {}
    if r is None:
        return out
    try:
        shapes = r.static_shapes()
    except RecordError:
        return out
    for k, shape in shapes.items():
        if int(np.prod(shape)) <= MAX_STATIC:
            try:
                x = np.asarray(r.static(k))
            except RecordError:
                continue
            if x.dtype.kind in "biuf":
                out[k] = x
    return out


def probe_tokens(info: dict, seq: int = 0) -> list[str] | None:
    """The probe batch's tokens if the run recorded them (group attr ``probe_tokens``: a list of
    strings, or one list per recorded sequence)."""
    toks = info.get("attrs", {}).get("probe_tokens") or info.get("attrs", {}).get("tokens")
    if not toks:
        return None
    if isinstance(toks[0], list):
        return [label(t) for t in toks[seq]] if seq < len(toks) else None
    return [label(t) for t in toks]


def is_live(run: Run) -> bool:
    """Still being written (status running and touched in the last 10 minutes)."""
    return run.status == "running" and not run.notes


def clear_caches() -> None:
    for f in (discover, summary, metrics, array_info, steps, matrix, pooled, head_series, vectors,
              head_outputs, static, _marker):
        f.clear()
    _open_run.clear()
    _reader.clear()
