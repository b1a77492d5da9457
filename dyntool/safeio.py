"""The one way readers open a file a run folder supplies (meta.json, config.json, metrics.jsonl,
zarr.json, a chunk, summary.json, checkpoint.pt): a *regular* file only (a FIFO, device, socket or
folder is refused without blocking), read with a size cap, JSON parsed with a nesting limit.

Every refusal is a :class:`BadFile` (a ``ValueError``) whose message names the file and says what
is wrong; a missing file stays ``FileNotFoundError`` and other I/O failures ``OSError``.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO, Iterator

MAX_JSON_BYTES = 16 << 20          # meta.json, config.json, zarr.json, summary.json
MAX_METRICS_BYTES = 1 << 30        # metrics.jsonl (streamed line by line)
MAX_LINE_BYTES = 1 << 20           # one metrics.jsonl line
MAX_DEPTH = 64                     # JSON nesting (dyntool writes at most ~5)


def inside(path: str | Path, root: Path) -> bool:
    """Whether ``path``, with every symlink resolved, lies under ``root`` (itself resolved): the one
    containment test of the readers and the app, so a link in a run folder can't point them
    outside the folder they were given."""
    return Path(os.path.realpath(path)).is_relative_to(root)


class BadFile(ValueError):
    """A file that is not read as it is: not a regular file, too big, too deeply nested, not JSON."""


_KIND = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
         (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KIND if test(mode)), "not a regular file")


def check_regular(path: str | Path, what: str | None = None) -> os.stat_result:
    """``stat`` of ``path`` (symlinks followed); :class:`BadFile` unless it is a regular file."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise BadFile(f"{what or Path(path).name} is {_kind(st.st_mode)}, not a regular file; not read")
    return st


@contextlib.contextmanager
def open_regular(path: str | Path, what: str | None = None) -> Iterator[tuple[BinaryIO, int]]:
    """``(binary file, size)`` of a regular file.  Opened non-blocking, so a FIFO never hangs the
    open; anything but a regular file is refused before a byte is read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno in (errno.ENXIO, errno.EOPNOTSUPP):       # a socket
            raise BadFile(f"{what or Path(path).name} is a socket or device, not a regular file; not read") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise BadFile(f"{what or Path(path).name} is {_kind(st.st_mode)}, not a regular file; not read")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        f = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with f:
        yield f, st.st_size


def _too_big(path: str | Path, n: int, cap: int, what: str | None = None) -> BadFile:
    return BadFile(f"{what or Path(path).name} is {n} bytes, over the {cap}-byte limit for it; not read")


def read_bytes(path: str | Path, cap: int, what: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``cap`` bytes (``what``: its name in messages)."""
    with open_regular(path, what) as (f, size):
        if size > cap:
            raise _too_big(path, size, cap, what)
        data = f.read(cap + 1)
    if len(data) > cap:                                       # grew while being read
        raise _too_big(path, len(data), cap, what)
    return data


def too_deep(obj: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether ``obj`` nests lists/dicts deeper than ``limit`` (iterative: no recursion)."""
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            o = o.values()
        elif not isinstance(o, list):
            continue
        if d > limit:
            return True
        stack.extend((v, d + 1) for v in o)
    return False


def loads(text: str | bytes, what: str = "JSON", limit: int = MAX_DEPTH) -> Any:
    """``json.loads`` with the nesting limit; :class:`BadFile` for anything that is not such JSON
    (syntax, encoding, nesting, an integer with thousands of digits)."""
    try:
        obj = json.loads(text)
    except RecursionError:
        raise BadFile(f"{what} nests deeper than {limit} levels; not read") from None
    except (ValueError, UnicodeDecodeError) as e:              # JSONDecodeError, int digit limit
        raise BadFile(f"{what} is not valid JSON ({str(e)[:120]})") from None
    if too_deep(obj, limit):
        raise BadFile(f"{what} nests deeper than {limit} levels; not read")
    return obj


def read_json(path: str | Path, cap: int = MAX_JSON_BYTES) -> Any:
    """A JSON document from a regular file of at most ``cap`` bytes, nesting at most MAX_DEPTH."""
    return loads(read_bytes(path, cap), Path(path).name)


def iter_lines(path: str | Path, cap: int = MAX_METRICS_BYTES,
               line_cap: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """Lines of a regular file (``None`` for a line longer than ``line_cap``, which is skipped);
    :class:`BadFile` if the file is bigger than ``cap``."""
    with open_regular(path) as (f, size):
        if size > cap:
            raise _too_big(path, size, cap)
        yield from lines_of(f, Path(path).name, cap, line_cap)


def lines_of(f: BinaryIO, what: str, cap: int = MAX_METRICS_BYTES,
             line_cap: int = MAX_LINE_BYTES) -> Iterator[bytes | None]:
    """:func:`iter_lines` of an open binary file (or ``io.BytesIO`` of bytes fetched from object
    storage); ``what`` names it in the :class:`BadFile` past ``cap`` bytes."""
    total = 0
    while True:
        line = f.readline(line_cap + 1)
        if not line:
            return
        total += len(line)
        if total > cap:
            raise _too_big(what, total, cap)
        if len(line) > line_cap and not line.endswith(b"\n"):
            while line and not line.endswith(b"\n"):           # skip the rest of the long line
                line = f.readline(line_cap + 1)
                total += len(line)
                if total > cap:
                    raise _too_big(what, total, cap)
            yield None
            continue
        yield line


def memory_available() -> int:
    """Bytes of memory this process can still use (available RAM, bounded by RLIMIT_AS)."""
    avail = None
    with contextlib.suppress(OSError, ValueError):
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    avail = int(line.split()[1]) * 1024
                    break
    if avail is None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    if avail is None:
        avail = 1 << 40
    with contextlib.suppress(ImportError, OSError, ValueError):
        import resource
        soft = resource.getrlimit(resource.RLIMIT_AS)[0]
        if soft != resource.RLIM_INFINITY:
            avail = min(avail, soft)
    return avail


def memory_problem(nbytes: int, what: str = "this", share: float = 0.8) -> str | None:
    """Why ``nbytes`` can't be held in memory (more than ``share`` of what is available), or None."""
    avail = memory_available()
    if nbytes > share * avail:
        return (f"{what} needs {nbytes / 2**30:.1f} GiB in memory and only {avail / 2**30:.1f} GiB "
                "is available")
    return None
