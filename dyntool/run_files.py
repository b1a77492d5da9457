"""A run's own files, parsed without ever raising: ``meta.json``, ``config.json`` and
``metrics.jsonl``, read through a run's storage backend (:mod:`dyntool.storage`), each problem
listed instead (docs/FORMAT.md).  Used by :mod:`dyntool.run` for every kind of run, so a damaged
file reads the same from a disk and from S3."""
from __future__ import annotations

from typing import Any

from . import safeio
from .record.ranks import RECORD_DIR
from .run_writer import STATUSES
from .storage import Outside


def read_json(backend, key: str, problems: list[str]) -> dict:
    """A JSON object from ``key`` of a run's storage backend (:mod:`dyntool.storage`); anything else
    (missing, symlinked outside the runs folder, not a regular file, too big, too deeply nested, not
    JSON, not an object) is a problem and reads as ``{}``."""
    try:
        raw = backend.get(key, safeio.MAX_JSON_BYTES)
    except Outside as e:
        problems.append(str(e))
        return {}
    except safeio.BadFile as e:
        problems.append(f"{key} is corrupted ({e})")
        return {}
    except OSError as e:
        problems.append(f"{key} can't be read ({e.strerror or e})")
        return {}
    return json_object(raw, key, problems)


def json_object(raw: bytes | None, name: str, problems: list[str]) -> dict:
    """The JSON object in ``raw``, a run file's bytes (``None``: the file is missing); missing, too
    deeply nested, not JSON or not an object is a problem and reads as ``{}``.  Every run file read
    through either storage backend parses through here, the same from a disk and from S3."""
    if raw is None:
        problems.append(f"{name} is missing")
        return {}
    try:
        obj = safeio.loads(raw, name)
    except safeio.BadFile as e:
        problems.append(f"{name} is corrupted ({e})")
        return {}
    if not isinstance(obj, dict):
        problems.append(f"{name} holds a {type(obj).__name__}, not an object; ignored")
        return {}
    return obj


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# meta.json fields the tools rely on, and the types they must have
_META_TYPES = {"id": str, "kind": str, "status": str, "created": str, "updated": str, "device": str,
               "error": str, "tags": list, "seeds": list, "final": dict}


def check_meta(meta: dict, problems: list[str]) -> dict:
    """Drop meta fields of the wrong type (reported), so one bad field can't break a listing."""
    out = dict(meta)
    for k, t in _META_TYPES.items():
        if k in out and out[k] is not None and not isinstance(out[k], t):
            problems.append(f"meta.json: {k} is a {type(out[k]).__name__}, not a {t.__name__}; ignored")
            del out[k]
    if "status" in out and out["status"] not in STATUSES:
        problems.append(f"meta.json: unknown status {out['status']!r}")
        del out["status"]
    if "tags" in out:
        out["tags"] = [str(t) for t in out["tags"]]
    if "seeds" in out and not all(_is_int(x) for x in out["seeds"]):
        problems.append(f"meta.json: seeds {out['seeds']!r} are not all integers; ignored")
        del out["seeds"]
    return out


MAX_STEP = 2**53 - 1        # a step beyond this is not a training step (and not exact as a float)
_I64 = 2**63


def _row_ok(row: Any) -> bool:
    if not isinstance(row, dict) or not _is_int(row.get("step")) or not 0 <= row["step"] <= MAX_STEP:
        return False
    for k, v in row.items():         # integers beyond int64 would turn a pandas column into objects
        if _is_int(v) and not -_I64 <= v < _I64:
            row[k] = float(v)
    return True


def read_metrics(backend, problems: list[str], key: str = "metrics.jsonl", finished: bool = False) -> list[dict]:
    """Rows of a run's metrics.jsonl (:func:`metric_rows`), on either backend; a file that can't
    be read is a problem and gives no rows."""
    try:
        return metric_rows(backend.lines(key), problems, finished)
    except Outside as e:
        problems.append(str(e))
    except safeio.BadFile as e:
        problems.append(f"{key} can't be read ({e})")
    except OSError as e:
        problems.append(f"{key} can't be read ({e.strerror or e})")
    return []


def metric_rows(lines, problems: list[str], finished: bool = False) -> list[dict]:
    """Rows of metrics.jsonl from its lines (``safeio.lines_of``; ``None`` = a line over the length
    cap): JSON objects with an integer ``step`` in [0, 2**53); other lines are skipped and reported
    (a partial last line, left by a kill mid-write, is skipped quietly, unless the run ``finished``:
    its writer ended every row, so the file was cut since).  Local and object-store runs both parse
    through here."""
    rows, bad, cut = [], [], None
    for i, line in enumerate(lines):
        if line is None:                           # longer than a metrics row can be
            bad.append(i)
            continue
        if not line.strip():
            continue
        try:
            row = safeio.loads(line, "a line")
        except safeio.BadFile:
            if line.endswith(b"\n"):              # else a partial last line (killed mid-write)
                bad.append(i)
            else:
                cut = i
            continue
        if not _row_ok(row):
            bad.append(i)
            continue
        rows.append(row)
    if bad:
        problems.append(f"metrics.jsonl has {len(bad)} malformed line(s) (not JSON, not an object, or "
                        f"no integer step in [0, 2**53)), first at line {bad[0] + 1}; skipped")
    if finished and cut is not None:
        problems.append(f"metrics.jsonl ends in a partial line (line {cut + 1}) although the run finished: "
                        "the file was cut after it was written; that row is skipped")
    return rows


def orphan_ranks(names) -> list[str]:
    """The problem of a run whose rank-0 recording is gone while other ranks' remain."""
    others = sorted(n for n in names if n.startswith("record.rank") and n.endswith(".zarr"))
    return [f"{RECORD_DIR} (rank 0's recording, which names the ranks) is missing but "
            f"{', '.join(others)} exist(s); the recording can't be read"] if others else []


def held_to_written(meta: dict, metrics_rows: int, record_steps: int, problems: list[str]) -> None:
    """A finished run says what it wrote (meta ``written``: metrics rows, committed record steps);
    fewer now means a file was cut or deleted since, which nothing else can tell (a row-boundary
    cut parses cleanly; a missing record reads as an unrecorded run).  Runs written before
    dyntool recorded ``written`` are not held to anything."""
    written = meta.get("written") if meta.get("status") == "finished" else None
    if not isinstance(written, dict):
        return
    rows, steps = written.get("metrics_rows"), written.get("record_steps")
    if isinstance(rows, int) and metrics_rows < rows:
        problems.append(f"metrics.jsonl holds {metrics_rows} rows; the finished run wrote {rows} "
                        "(cut or deleted since)")
    if isinstance(steps, int) and record_steps < steps:
        problems.append(f"record.zarr holds {record_steps} committed steps; the finished run wrote {steps} "
                        "(deleted, or a commit marker lowered, since)")
