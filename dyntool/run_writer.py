"""Writing a run directory: config.json, meta.json, metrics.jsonl, record.zarr (docs/FORMAT.md).

``RunWriter.create(...)`` as a context manager.  It never deletes or overwrites an
existing run; SIGTERM and SIGINT (also when SIGINT was inherited as ignored, e.g. a job started
with ``&`` by a script) raise :class:`Interrupted`, except inside :func:`critical_section`
(one training step), where the signal is held until the section ends so a step is never half
applied (a second signal interrupts at once).  On the way out the recorder is flushed and
``meta.status`` becomes ``finished``, ``interrupted`` or ``failed``; if the disk is full the
status is still written (in place when no new file fits) and no ``meta.json.tmp`` is left.

Where the run lives (a local folder, an object-store prefix) is the storage backend's business
(:mod:`dyntool.storage`); one :class:`RunWriter` writes both.  ``STATUSES`` lives here, beside
what writes it; the reader is :mod:`dyntool.run`.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import platform
import secrets
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from .errors import NonFiniteLossError
from .record.ranks import RECORD_DIR, rank_dir  # noqa: F401  (RECORD_DIR: defined once, there)
from .record.store_writer import StoreWriter
from .storage import Backend, open_backend
from .storage.local import write_atomic
from .version import __version__

STATUSES = ("running", "finished", "failed", "interrupted")


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM/SIGINT so runs close cleanly."""


class _Signals:
    depth = 0                   # > 0 inside critical_section()
    pending: int | None = None  # a signal held until the section ends
    said = False                # this rank told the group's store it was asked to stop
    watching = False            # a rank without a RunWriter says so too (_say_when_stopped)


def _on_signal(signum, frame):
    _say_asked_to_stop()
    if _Signals.depth > 0 and _Signals.pending is None:
        _Signals.pending = signum          # finish the step first; a second signal is not held
        return
    _Signals.pending = None
    raise Interrupted(f"signal {signum}")


@contextlib.contextmanager
def critical_section():
    """Hold SIGTERM/SIGINT (as installed by RunWriter) until the block ends, then raise
    :class:`Interrupted`: used around one training step so parameters, optimizer, RNG and
    metrics always describe the same step when a run is interrupted and checkpointed."""
    if not _Signals.watching and _Signals.depth == 0 and _multi_process() is not None:
        _say_when_stopped()
    _Signals.depth += 1
    try:
        yield
    except Exception as e:
        signum = _held_while_distributed() if _Signals.depth == 1 else None
        if isinstance(signum, list):            # a peer vanished: its kill is this run's failure
            _Signals.pending = None
            raise RuntimeError(f"rank {', '.join(map(str, signum))} ended without being asked to stop "
                               f"(killed: SIGKILL, the out-of-memory killer?); this rank's step then "
                               f"failed: {type(e).__name__}: {e}") from e
        if signum is None:
            raise
        _Signals.pending = None
        raise Interrupted(f"signal {signum} (this rank's step ended in {type(e).__name__})") from None
    finally:
        _Signals.depth -= 1
    if _Signals.depth == 0 and _Signals.pending is not None:
        signum, _Signals.pending = _Signals.pending, None
        raise Interrupted(f"signal {signum}")


STOP_WAIT_S = 1.0
FAILED_KEY = "dyntool/step_failed/"     # + rank: in the process group's store
ASKED_KEY = "dyntool/asked_to_stop/"    # + rank: that rank received SIGTERM/SIGINT


def _multi_process():
    """torch.distributed when this is one rank of several, else None (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist
    except Exception:                           # noqa: BLE001 - a group being torn down: one process
        pass
    return None


def _say_asked_to_stop() -> None:
    """A rank that receives a stop signal says so in the group's store, once: a peer whose
    collective this rank's leaving breaks then knows it was a stop, not a kill."""
    dist = _multi_process()
    if dist is None or _Signals.said:
        return
    _Signals.said = True
    try:
        store = _group_store()
        if store is not None:
            store.set(ASKED_KEY + str(dist.get_rank()), "1")
    except Exception:                           # noqa: BLE001 - the store is gone: peers read a failure
        pass


def _say_when_stopped() -> None:
    """A rank that writes no run (DDP's others) keeps Python's own SIGTERM/SIGINT behaviour, but
    says it was asked to stop first, so rank 0 can tell a stop from a kill."""
    _Signals.watching = True

    def say_then(default):
        def handler(signum, frame):
            _say_asked_to_stop()
            if default is signal.default_int_handler:
                default(signum, frame)                    # KeyboardInterrupt, as before
            signal.signal(signum, signal.SIG_DFL)         # SIGTERM's default: end the process
            os.kill(os.getpid(), signum)
        return handler
    for sig, default in ((signal.SIGTERM, signal.SIG_DFL), (signal.SIGINT, signal.default_int_handler)):
        try:
            if signal.getsignal(sig) is default:
                signal.signal(sig, say_then(default))
        except ValueError:                                # not the main thread
            pass


def _held_while_distributed() -> int | list[int] | None:
    """The signal held when a step of a multi-process run fails, if the failure came from a stop.
    torchrun sends every rank the signal; a rank that stops at its step boundary breaks the
    collective another rank is in (gloo: connection reset), whose own signal may land a moment
    later, so it is waited for briefly: the run then reads as interrupted.  But torchrun also
    signals every rank when one rank *fails*: so a rank whose step fails with no signal held says
    so in the group's store first, and a signal does not count once another rank has said it.
    A single process never waits (its failure is its own).  And a rank killed outright (SIGKILL,
    the out-of-memory killer) says nothing, breaks the collective all the same, and torchrun then
    signals the others: a stop only if every other rank was asked to stop too (each says so in
    the store when its signal lands); else the ranks that were not are returned, for the failure."""
    import time
    dist = _multi_process()
    if dist is None:
        return None
    rank, world, store = dist.get_rank(), dist.get_world_size(), _group_store()
    if store is None:
        return None
    peers = [r for r in range(world) if r != rank]
    try:
        if _Signals.pending is None:            # nothing asked this rank to stop (yet)
            store.set(FAILED_KEY + str(rank), "1")
        end = time.monotonic() + STOP_WAIT_S
        while _Signals.pending is None and time.monotonic() < end:
            time.sleep(0.02)                    # the Python handler runs here (it only records: depth > 0)
        if _Signals.pending is None or any(store.check([FAILED_KEY + str(r)]) for r in peers):
            return None                         # no stop, or another rank failed first: its failure
        end = time.monotonic() + STOP_WAIT_S
        while (unasked := [r for r in peers if not store.check([ASKED_KEY + str(r)])]) and time.monotonic() < end:
            time.sleep(0.02)
        if unasked:
            return unasked
    except Exception:                           # the store is gone with its host: the failure stands
        return None
    return _Signals.pending


def _group_store():
    """A client of the launcher's key-value store (torchrun's, at MASTER_ADDR:MASTER_PORT, which
    outlives the ranks), or None (another launcher, or the store is gone)."""
    import datetime

    import torch.distributed as dist
    try:
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                             timeout=datetime.timedelta(seconds=5))
    except Exception:
        return None


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _git_commit() -> dict[str, Any]:
    src = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=src, capture_output=True, text=True,
                             timeout=5).stdout.strip()
        dirty = bool(subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"], cwd=src,
                                    capture_output=True, text=True, timeout=5).stdout.strip())
        return {"git_commit": sha or None, "git_dirty": dirty if sha else None}
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None, "git_dirty": None}


def environment() -> dict[str, Any]:
    """Library versions and machine facts saved with every run."""
    import numpy
    import torch
    import zarr
    return {"dyntool": __version__, "torch": torch.__version__, "numpy": numpy.__version__,
            "zarr": zarr.__version__, "python": platform.python_version(),
            "platform": platform.platform(), "cpu_count": os.cpu_count(), **_git_commit()}


def _jsonable(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None                      # JSON has no NaN/inf; null marks a non-finite value
    if hasattr(x, "item") and getattr(x, "ndim", 1) == 0:
        return _jsonable(x.item())
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def write_json_atomic(path: Path, obj: Any, in_place_fallback: bool = False) -> None:
    """Temp file + ``os.replace``.  On failure the temp file is removed (never a 0-byte
    ``.tmp`` left behind); with ``in_place_fallback`` a full disk (ENOSPC/EDQUOT) falls back to
    rewriting the existing file in place, which reuses its blocks (used for the final status)."""
    write_atomic(Path(path), _json_bytes(obj), in_place_fallback)


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(_jsonable(obj), indent=2).encode()


def ensure_out_dir(out_dir: str | Path) -> Path | str:
    """Create ``out_dir`` if needed and check it is writable (call before any expensive setup): its
    backend's :meth:`~dyntool.storage.Backend.ensure_dir`.  An object-store URL is returned as its
    text: nothing local is ever made from a URL."""
    return open_backend(out_dir, "--out", create=True).ensure_dir()


class RunWriter:
    """Writes one run through its storage backend (:mod:`dyntool.storage`), a local folder or an
    object-store prefix alike: every JSON file replaced whole (``config.json`` created exclusively:
    a run is never overwritten), metrics appended line by line, the record through a zarr store of
    the backend.  ``path``: the run folder's ``Path``, or its URL as text."""

    def __init__(self, backend: Backend, meta: dict[str, Any]):
        self.backend, self.meta = backend, meta
        self.path = backend.path
        self._metrics = backend.appender("metrics.jsonl")
        self._rows = 0                      # metrics rows written: a finished run is held to them
        self.store = None
        self._old_handlers: dict = {}

    @classmethod
    def create(cls, out_dir: str | Path, kind: str, config: dict[str, Any], name: str | None = None,
               seeds: list[int] | None = None, tags: list[str] | None = None, device: str = "cpu",
               extra_meta: dict | None = None) -> "RunWriter":
        out = open_backend(ensure_out_dir(out_dir), "--out", create=True)
        run_id = name or new_run_id(kind)
        backend = out.create(run_id)
        backend.put("config.json", _json_bytes(config), exclusive=True)
        w = cls(backend, new_meta(run_id, kind, seeds, tags, device, extra_meta))
        w.backend.put("meta.json", _json_bytes(w.meta))
        return w

    # -- recording ----------------------------------------------------------------------
    def open_store(self, chunk_steps: int = 16, flush_seconds: float = 30.0, attrs: dict | None = None,
                   rank: int = 0):
        self.store = StoreWriter(self.backend.zarr_store(rank_dir(rank), "w"), chunk_steps, flush_seconds, attrs)
        return self.store

    def log(self, step: int, **metrics: Any) -> None:
        """Append one row to metrics.jsonl (``step`` first)."""
        self._metrics.write(json.dumps(_jsonable({"step": int(step), **metrics})) + "\n")
        self._rows += 1

    def update_meta(self, _final_status: bool = False, **kv: Any) -> None:
        self.meta.update(kv, updated=_now())
        self.backend.put("meta.json", _json_bytes(self.meta), last_resort=_final_status)

    def finish(self, status: str = "finished", **kv: Any) -> None:
        """Flush and close everything, then write the final status.  A failure while flushing
        (e.g. disk full) turns ``finished`` into ``failed`` and is re-raised after the status
        is written, so meta.json never stays ``running`` after the process is gone."""
        assert status in STATUSES
        errors: list[BaseException] = []
        for close in ((self.store.close if self.store is not None else None), self._metrics.close):
            if close is None:
                continue
            try:
                close()
            except Exception as e:
                errors.append(e)
        if errors and status == "finished":
            e = errors[0]
            status, kv = "failed", {**kv, "error": f"{type(e).__name__}: {e}"}
        if status == "finished":            # what every file must still hold later (`check`)
            kv = {**kv, "written": {"metrics_rows": self._rows,
                                    **({"record_steps": self.store.steps_committed} if self.store else {})}}
        self.update_meta(_final_status=True, status=status, **kv)
        if errors:
            raise errors[0]

    # -- context manager: signals and final status ----------------------------------------
    def __enter__(self) -> "RunWriter":
        # SIGINT too: when it was inherited as ignored (a background job of a script) Python
        # installs no KeyboardInterrupt handler, and `kill -INT` would do nothing at all
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self._old_handlers[sig] = signal.signal(sig, _on_signal)
            except ValueError:     # not the main thread (e.g. inside a test runner thread)
                pass
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for sig, h in self._old_handlers.items():
            signal.signal(sig, h)
        _Signals.pending = None
        if exc_type is None:
            self.finish("finished")
            return False
        try:
            if issubclass(exc_type, KeyboardInterrupt):
                # the command that continues it (set by the trainer), so `info` can say it later
                nxt = getattr(exc, "next_step", None)
                self.finish("interrupted", error=str(exc) or "interrupted", **({"next_step": nxt} if nxt else {}))
            elif issubclass(exc_type, NonFiniteLossError):
                self.finish("failed", error=str(exc), failed_step=exc.step)
            else:
                self.finish("failed", error=f"{exc_type.__name__}: {exc}")
        except Exception:
            pass               # the original exception is the one to report
        return False


def new_run_id(kind: str) -> str:
    return f"{kind}-{_dt.datetime.now().strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def new_meta(run_id: str, kind: str, seeds, tags, device: str, extra_meta: dict | None) -> dict:
    """A new run's meta.json: what every run, local or in object storage, starts with."""
    return {"id": run_id, "kind": kind, "status": "running", "created": _now(), "updated": _now(),
            "seeds": list(seeds or []), "tags": list(tags or []), "device": device,
            "argv": sys.argv, **environment(), **(extra_meta or {})}


RemoteRunWriter = RunWriter      # the old name of a writer into object storage: one class writes both


class RankRun:
    """What a rank > 0 writes into the run rank 0 created (a local path, or an ``s3://``/``file://``
    URL): its own recording ``record.rank{r}.zarr``, nothing else."""

    def __init__(self, path, rank: int):
        self.rank, self.store = rank, None
        self.backend = open_backend(path, create=True)
        self.path = self.backend.path

    def open_store(self, chunk_steps: int = 16, flush_seconds: float = 30.0, attrs: dict | None = None):
        self.store = StoreWriter(self.backend.zarr_store(rank_dir(self.rank), "w"), chunk_steps,
                                 flush_seconds, attrs)
        return self.store

    def update_meta(self, **fields) -> None:
        """Nothing: meta.json is rank 0's file (every rank computes the same ``attention_paths``
        and ``compiled_steps``; rank 0 writes them)."""

    def close(self) -> None:
        if self.store is not None:
            self.store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False
