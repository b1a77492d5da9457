"""The local backend: a run is a folder.  Reads go through :mod:`dyntool.safeio` (regular files
only, size caps, containment in the folder the reader was given), writes through
:mod:`dyntool.atomic` (temp file + rename), the record through the guarded zarr store
(:mod:`dyntool.record.guarded`), which :class:`~dyntool.record.reader.RecordReader` reads."""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Iterator

from .. import safeio
from ..atomic import replacing
from ..errors import ConfigError, RunError
from ..record.guarded import GuardedStore, chunk_files, zstd_frame_ok
from .base import RUN_FILES, Backend, Outside


def write_atomic(path: Path, data: bytes, last_resort: bool = False) -> None:
    """Temp file + ``os.replace``; on failure the temp file is removed (never a 0-byte ``.tmp``
    left behind).  ``last_resort``: a full disk (ENOSPC/EDQUOT) rewrites the existing file in place
    instead, which reuses its blocks (a run's final status must land even then)."""
    try:
        with replacing(path) as tmp:
            tmp.write_bytes(data)
    except OSError as e:
        if not (last_resort and e.errno in (errno.ENOSPC, errno.EDQUOT) and path.exists()):
            raise
        with open(path, "r+b") as f:
            f.write(data)
            f.truncate()


def disk_usage(path: Path) -> int:
    """Allocated bytes below ``path`` (``st_blocks``, as ``du`` counts them: for many small chunk
    files this is well above the sum of their sizes); symlinks are not followed."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            total += getattr(st, "st_blocks", 0) * 512 or st.st_size
            if e.is_dir(follow_symlinks=False):
                stack.append(e.path)
    return total


def is_run_dir(path: Path) -> bool:
    try:
        return path.is_dir() and any((path / f).exists() for f in RUN_FILES)
    except (OSError, ValueError):        # permission denied, a NUL byte
        return False


def inside_run(p: Path) -> Path | None:
    """The run folder ``p`` lies in (``p`` itself included), or None."""
    for q in [p, *p.parents]:
        if q.exists() and is_run_dir(q):
            return q
    return None


def _has_records(q: Path) -> bool:
    return any(m.stat().st_size > 0 for m in q.rglob("metrics.jsonl"))


class LocalBackend(Backend):
    """A local folder.  ``root``: every file read must resolve inside it (default: the folder).
    Every default of :class:`~.base.Backend` is overridden: a disk streams files, has links and
    FIFOs to refuse, and folders that exist empty."""

    def __init__(self, where: Path, root: Path | str | None = None):
        self.where = Path(where)
        self.root = Path(os.path.realpath(root if root is not None else self.where))

    def __repr__(self) -> str:
        return f"LocalBackend({str(self.where)!r})"

    @property
    def path(self) -> Path:
        return self.where

    def _at(self, key: str) -> Path:
        return self.where / key if key else self.where

    def _inside(self, key: str) -> Path:
        p = self._at(key)
        if not safeio.inside(p, self.root):
            raise Outside(f"{p.name} resolves outside {self.root}; not read")
        return p

    # -- objects -----------------------------------------------------------------------------
    def get(self, key: str, cap: int | None = None) -> bytes | None:
        p = self._inside(key)
        try:
            if cap is not None:
                return safeio.read_bytes(p, cap)
            with safeio.open_regular(p) as (f, _):         # uncapped: still a regular file only
                return f.read()
        except FileNotFoundError:
            return None

    def lines(self, key: str) -> Iterator[bytes | None]:
        p = self._inside(key)
        try:
            yield from safeio.iter_lines(p)
        except FileNotFoundError:
            return

    def put(self, key: str, data: bytes, exclusive: bool = False, last_resort: bool = False) -> None:
        p = self._at(key)
        if exclusive and p.exists():
            raise RunError(f"{p} already exists; existing runs are never overwritten")
        write_atomic(p, data, last_resort)

    def write_with(self, key: str, write) -> None:
        with replacing(self._at(key)) as tmp:          # streamed to a temp file, renamed when whole
            write(tmp)

    @contextlib.contextmanager
    def open_file(self, key: str):
        with safeio.open_regular(self._inside(key)) as (f, _):
            yield f

    def has(self, key: str) -> bool:
        return self.what_is(key) == "file"

    def what_is(self, key: str) -> str:
        p = self._at(key)
        if p.is_symlink():
            return "link"
        if not p.exists():
            return "missing"
        return "file" if p.is_file() else "folder" if p.is_dir() else "other"

    def append(self, key: str, line: str) -> None:
        with open(self._at(key), "a") as f:
            f.write(line)

    def appender(self, key: str):
        return open(self._at(key), "a", buffering=1)     # line-buffered: one flush per row

    def list(self, key: str = "") -> tuple[list[str], list[str]]:
        dirs, files = [], []
        for child in sorted(self._at(key).iterdir()):
            try:                              # an unreadable entry (permissions, /proc) is skipped
                (dirs if child.is_dir() else files).append(child.name)
            except (OSError, ValueError):
                continue
        return dirs, files

    def exists(self, key: str = "") -> bool:
        try:
            return self._at(key).exists()
        except (OSError, ValueError):
            return False

    def delete(self, key: str = "") -> None:
        p = self._at(key)
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def size(self) -> int:
        return disk_usage(self.where)

    # -- the record --------------------------------------------------------------------------
    def zarr_store(self, sub: str, mode: str = "r", specs: dict | None = None):
        if mode == "r":
            return GuardedStore(self._at(sub), self.root, specs)
        from zarr.storage import LocalStore
        return LocalStore(self._at(sub))

    def has_group(self, sub: str) -> bool:
        rec = self._at(sub)
        return rec.is_dir() or rec.is_symlink()        # a link out is opened, and refused, not skipped

    def walk(self, key: str, guarded: bool = True) -> tuple[set[str], set[str], set[str]]:
        odd: set[str] = set()
        files, outside = chunk_files(self._at(key), self.root if guarded else None, odd)
        return files, outside, odd

    def frame_problem(self, key: str, trailer: int = 0) -> str | None:
        return zstd_frame_ok(self._at(key), trailer=trailer)

    # -- runs and folders of runs ------------------------------------------------------------
    def child(self, name: str) -> "LocalBackend":
        return LocalBackend(self.where / name, self.root)

    def create(self, name: str) -> "LocalBackend":
        path = self.where / name
        try:
            path.mkdir()
        except FileExistsError:
            raise RunError(f"run {path} already exists; choose another name (existing runs are never overwritten)") from None
        except OSError as e:
            raise RunError(f"run directory {path} can't be created: {e.strerror or e}") from None
        return LocalBackend(path)

    def is_run(self) -> bool:
        return is_run_dir(self.where)

    def contained(self, key: str = "") -> bool:
        return safeio.inside(self._at(key), self.root)

    def below(self, rel: str) -> Path:
        p = (self.where / rel).resolve()
        if not safeio.inside(p, self.root):
            raise Outside(f"{rel} resolves outside {self.root}")
        return p

    def is_dir(self) -> bool:
        try:
            return self.where.is_dir()
        except (OSError, ValueError):
            return False

    def signature(self, keys) -> tuple:
        out = []
        for key in keys:
            try:
                s = self._at(key).stat()
                out.append((s.st_mtime_ns, s.st_size))
            except OSError:
                out.append(None)
        return tuple(out)

    # -- where commands write ----------------------------------------------------------------
    plain_files = True

    def ensure_dir(self) -> Path:
        out = self.where
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise RunError(f"output directory {out} can't be created: {e.strerror or e}") from None
        if not os.access(out, os.W_OK):
            raise RunError(f"output directory {out} is not writable")
        return out

    # -- the output guard --------------------------------------------------------------------
    def check_out(self, what: str = "--out") -> Path:
        """The folder can be created (or exists), is writable and is not inside a run.  Creates
        nothing (a probe folder, removed at once)."""
        p = self.where
        if "\0" in str(p):
            raise ConfigError(what, "contains a NUL byte")
        if any(len(os.fsencode(part)) > 255 for part in p.parts):    # NAME_MAX: stat() itself would fail
            raise ConfigError(what, "has a folder name longer than the file system allows (255 bytes)")
        # PATH_MAX, with room for the run's own files below it; said without echoing the path
        room = 4096 - 200
        if len(os.fsencode(str(p.absolute()))) > room:
            raise ConfigError(what, f"is {len(os.fsencode(str(p.absolute())))} bytes long as an absolute path; "
                                    f"a run's files below it need it under {room} (the file system's "
                                    "path limit is 4096): use a shorter folder")
        run = inside_run(p.absolute())
        if run is not None:
            raise ConfigError(what, f"{p} is inside the run {run}; runs are never written into "
                                    "(pass the folder that holds the runs)")
        anchor = p.absolute()
        while not anchor.exists():                       # nearest existing ancestor
            if anchor.is_symlink():                      # a dangling link: mkdir would fail on it
                raise RunError(f"output directory {p} can't be created: {anchor} is a broken symlink")
            anchor = anchor.parent
        if not anchor.is_dir():
            raise RunError(f"output directory {p} can't be created: {anchor} is not a directory")
        try:                                             # os.access lies for root and read-only mounts
            tempfile.TemporaryDirectory(dir=anchor, prefix=".dyntool-probe-").cleanup()
        except OSError as e:
            verb = "is not writable" if anchor == p.absolute() else f"can't be created in {anchor}"
            raise RunError(f"output directory {p} {verb}: {e.strerror or e}") from None
        return p

    def mark(self):
        """The folders this command will have made (the ``out`` folder and parents that do not
        exist yet, deepest first), what ``out`` holds now, and when the command started."""
        p = self.where.absolute()
        created = [q for q in [p, *p.parents] if not q.exists()]
        return p, created, set(os.listdir(p)) if p.is_dir() else set(), time.time() - 1

    def clean_up(self, mark) -> None:
        """Only folders that did not exist at ``mark`` and were created after it go: the new
        ``out`` folder itself (and parents it made) or new entries in it; never a run that was
        there before, nor anything that recorded a metrics row (a run that failed late keeps it)."""
        p, created, before, start = mark
        with contextlib.suppress(OSError):
            if created:
                top = created[-1]                       # the shallowest folder this command made
                if top.exists() and top.stat().st_ctime >= start and not _has_records(top):
                    shutil.rmtree(top)
                return
            for name in set(os.listdir(p)) - before:
                q = p / name
                if q.is_dir() and not q.is_symlink() and q.stat().st_ctime >= start and not _has_records(q):
                    shutil.rmtree(q)
