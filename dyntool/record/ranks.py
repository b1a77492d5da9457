"""Per-rank recordings of one run, and the merged view the tools read.

**Layout.**  Under FSDP every rank records the heads of its own batch shard into its own zarr v3
group beside the others in the run directory::

    RUN/record.zarr          rank 0 (a complete single-rank recording on its own)
    RUN/record.rank1.zarr    rank 1
    ...

Each is written by its own :class:`~dyntool.record.store_writer.StoreWriter` with its own commit
marker ``steps_written``, so killing one rank leaves every rank's committed steps readable.  Group
attributes: ``rank``, ``world_size``, ``seq_offset`` (the global index of the rank's first
sequence) and ``shard_axis = "seq"``.

**Merged view** (:class:`RankedStore`, what :attr:`dyntool.run.Run.store`, ``to_xarray``,
``info``/``check`` and the app see): the rows committed by *every* rank (the smallest marker);
arrays with a ``seq`` axis are concatenated along it in rank order; arrays without one (per-head
or per-step scalars of each rank's shard) are combined by the rule named in their attribute
``rank_reduce``: ``max``, ``sum``, ``mean`` (the default), ``rms`` (√mean of squares: an RMS over
equal-sized shards) or ``l2`` (√sum of squares: a Frobenius norm).  A rank's own recording,
unmerged, is ``RankedStore.ranks[r]``.  Any recorded array fits this scheme (a new per-head
statistic only declares its ``rank_reduce``); nothing is gathered across ranks while training.
"""
from __future__ import annotations

import numpy as np

from .reader import RecordReader
from .store import RecordError

RECORD_DIR = "record.zarr"
SHARD_DIM = "seq"
# how the merged view combines a per-rank array without a seq axis (attribute rank_reduce)
REDUCE = {"logit_max": "max", "logit_norm": "rms", "routing_residual": "l2", "grad_scale": "mean",
          "probe_loss": "mean"}


def rank_dir(rank: int) -> str:
    return RECORD_DIR if rank == 0 else f"record.rank{rank}.zarr"


def declare_reducers(store, extra: dict | None = None) -> None:
    """Give every known per-rank scalar its ``rank_reduce`` attribute before the first append."""
    for name, how in {**REDUCE, **(extra or {})}.items():
        store.declare(name, attrs={"rank_reduce": how})


def _combine(parts: list[np.ndarray], how: str) -> np.ndarray:
    x = np.stack([np.asarray(p) for p in parts])
    dt = np.result_type(x.dtype, np.float32) if x.dtype.kind == "f" else x.dtype
    if how == "max":
        return x.max(axis=0)
    if how == "sum":
        return x.sum(axis=0)
    if how == "rms":
        return np.sqrt((x.astype(np.float64) ** 2).mean(axis=0)).astype(dt)
    if how == "l2":
        return np.sqrt((x.astype(np.float64) ** 2).sum(axis=0)).astype(dt)
    if x.dtype.kind in "iub":                       # integer/bool arrays: every rank's, if equal
        return x[0]
    return x.astype(np.float64).mean(axis=0).astype(dt)


class RankedArray:
    """One array merged over ranks (concatenated along ``seq``, else reduced); the same read API
    as :class:`~dyntool.record.store.RecordedArray`."""

    def __init__(self, name: str, parts: list, n: int):
        self.name, self.parts, self.n = name, parts, n
        first = parts[0]
        self.dims, self.attrs, self.dtype = first.dims, dict(first.attrs), first.dtype
        self.axis = self.dims.index(SHARD_DIM) if SHARD_DIM in self.dims else None
        self.how = str(self.attrs.get("rank_reduce", "mean"))
        self.sizes = [p.shape[self.axis] for p in parts] if self.axis is not None else None
        def other(p):                  # every axis but step (ranks commit at their own pace) and seq
            return tuple(n for i, n in enumerate(p.shape) if i and i != self.axis)
        if any(other(p) != other(first) for p in parts[1:]):
            raise RecordError(f"array {name}: the ranks recorded different shapes "
                              f"{[p.shape[1:] for p in parts]}")

    @property
    def shape(self) -> tuple[int, ...]:
        s = list(self.parts[0].shape)
        s[0] = self.n
        if self.axis is not None:
            s[self.axis] = sum(self.sizes)
        return tuple(s)

    @property
    def ndim(self) -> int:
        return len(self.dims) if self.dims else self.parts[0].ndim

    def __len__(self) -> int:
        return self.n

    def _bounded(self, first):
        """The step key bounded by the merged marker (a rank may have committed more)."""
        if isinstance(first, (int, np.integer)):
            i = int(first) + (self.n if first < 0 else 0)
            if not 0 <= i < self.n:
                raise IndexError(f"{self.name}: index {first} out of range for {self.n} recorded steps")
            return i
        if isinstance(first, slice):
            return slice(*first.indices(self.n))
        idx = np.asarray(first).astype(np.int64)
        idx = np.where(idx < 0, idx + self.n, idx)
        if idx.size and (idx.min() < 0 or idx.max() >= self.n):
            raise IndexError(f"{self.name}: indices out of range for {self.n} recorded steps")
        return idx

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if Ellipsis in key:
            i = key.index(Ellipsis)
            key = key[:i] + (slice(None),) * (self.ndim - len(key) + 1) + key[i + 1:]
        key = key + (slice(None),) * (self.ndim - len(key))
        key = (self._bounded(key[0]),) + key[1:]
        if self.axis is None:
            return _combine([p[key] for p in self.parts], self.how)
        k = key[self.axis]
        offs = np.cumsum([0] + self.sizes)
        if isinstance(k, (int, np.integer)):
            g = int(k) + (offs[-1] if k < 0 else 0)
            if not 0 <= g < offs[-1]:
                raise IndexError(f"{self.name}: seq {k} out of range for {offs[-1]} sequences")
            r = int(np.searchsorted(offs, g, side="right") - 1)
            return self.parts[r][key[:self.axis] + (g - offs[r],) + key[self.axis + 1:]]
        if not isinstance(k, slice):
            raise IndexError(f"{self.name}: the seq axis takes an integer or a slice")
        want = np.arange(offs[-1])[k]
        out_axis = sum(1 for x in key[:self.axis] if not isinstance(x, (int, np.integer)))
        pieces, order = [], []
        for r, p in enumerate(self.parts):
            mine = want[(want >= offs[r]) & (want < offs[r + 1])]
            if mine.size:
                lo, hi = int(mine.min() - offs[r]), int(mine.max() - offs[r]) + 1
                part = p[key[:self.axis] + (slice(lo, hi),) + key[self.axis + 1:]]
                pieces.append(np.take(part, mine - offs[r] - lo, axis=out_axis))
                order.append(mine)
        if not pieces:
            shape = list(self.parts[0][key[:self.axis] + (slice(0, 0),) + key[self.axis + 1:]].shape)
            return np.empty(shape, dtype=self.dtype)
        out = np.concatenate(pieces, axis=out_axis)
        got = np.concatenate(order)
        if np.array_equal(got, want):
            return out
        srt = np.argsort(got)                                   # a negative step: into `want` order
        return np.take(out, srt[np.searchsorted(got[srt], want)], axis=out_axis)

    def __array__(self, dtype=None, copy=None):
        out = self[:]
        return out.astype(dtype) if dtype is not None else out

    def __repr__(self) -> str:
        dims = ", ".join(f"{d}={s}" for d, s in zip(self.dims, self.shape))
        return f"RankedArray({self.name}: {dims}; {self.dtype}; {len(self.parts)} ranks)"


class RankedStore:
    """The per-rank recordings of one run read as one (see the module doc).  Duck-types
    :class:`~dyntool.record.reader.RecordReader` (``names``, ``[name]``, ``arrays``, ``static*``,
    ``verify``, ``steps_written``, ``marker``, ``attrs``, ``group``, ``problems``)."""

    def __init__(self, ranks: list, problems: list[str] | None = None):
        self.ranks = ranks
        main = ranks[0]
        self.path, self.group, self.attrs = main.path, main.group, main.attrs
        self.problems = list(problems or [])
        for r, st in enumerate(ranks):
            self.problems += [f"rank {r}: {p}" if r else p for p in st.problems]
        self.marker = main.marker
        self.steps_written = min(st.steps_written for st in ranks)
        self.unreadable = {n: why for st in ranks for n, why in getattr(st, "unreadable", {}).items()}
        every = [set(st.names()) for st in ranks]
        self._names = sorted(set.intersection(*every))
        for name in sorted(set.union(*every) - set(self._names)):     # never dropped silently
            missing = [r for r, names in enumerate(every) if name not in names]
            why = f"array {name}: not readable on rank(s) {missing}; left out of the merged record"
            self.unreadable.setdefault(name, why)
            if not any(p.startswith(f"array {name}") or f"array {name}:" in p for p in self.problems):
                self.problems.append(why)
        self._cache: dict = {}
        if "step" in self._names and self.steps_written:
            steps = [st["step"][:self.steps_written] for st in ranks]
            bad = [r for r, s in enumerate(steps) if not np.array_equal(s, steps[0])]
            if bad:
                self.problems.append(f"ranks {bad} recorded other steps than rank 0; reading rank 0 only")
                self.ranks = [main]
                self.steps_written = main.steps_written

    def names(self) -> list[str]:
        return list(self._names)

    def __getitem__(self, name: str):
        if name not in self._cache:
            if name not in self._names:
                raise RecordError(f"array {name} is not readable on every rank of this recording")
            parts = [st[name] for st in self.ranks]
            self._cache[name] = parts[0].bounded(self.steps_written) \
                if len(parts) == 1 else RankedArray(name, parts, self.steps_written)
        return self._cache[name]

    def arrays(self) -> dict:
        return {n: self[n] for n in self.names()}

    def static_names(self) -> list[str]:
        return self.ranks[0].static_names()

    def static_shapes(self):
        return self.ranks[0].static_shapes()

    def static(self, name: str):
        return self.ranks[0].static(name)

    def refresh(self) -> None:
        for st in self.ranks:
            st.refresh()
        self.__init__(self.ranks)

    def verify(self, full: bool = False) -> list[str]:
        out = list(self.problems)
        for r, st in enumerate(self.ranks):
            out += [f"rank {r}: {p}" if r else p for p in st.verify(full) if p not in st.problems]
        return out


def open_group(backend, sub: str, limit: int | None = None) -> RecordReader | None:
    """The reader of the zarr group at ``sub`` of a storage ``backend`` (:mod:`dyntool.storage`), or
    None when the backend holds none there (``backend.has_group``)."""
    return RecordReader(backend, sub, limit) if backend.has_group(sub) else None


def open_record(backend, limit: int | None = None):
    """The run's recording, on either storage backend (:mod:`dyntool.storage`): a
    :class:`~dyntool.record.reader.RecordReader` of one rank, a :class:`RankedStore` over the
    ``world_size`` per-rank recordings rank 0 announces, or None when the run has no recording.  A
    rank whose recording is missing or unreadable is a problem, and the view falls back to rank 0
    alone."""
    main = open_group(backend, RECORD_DIR, limit)
    if main is None:
        return None
    world = main.attrs.get("world_size", 1)
    if not isinstance(world, int) or isinstance(world, bool) or world <= 1:
        return main
    ranks = [main]
    for r in range(1, world):
        try:
            st = open_group(backend, rank_dir(r), limit)
        except RecordError as e:
            why = str(e).split(" (GroupNotFound")[0]
        else:
            if st is not None:
                ranks.append(st)
                continue
            why = "it is missing"
        return RankedStore([main], [f"rank {r}'s recording {rank_dir(r)} can't be read ({why}); "
                                    "showing rank 0's sequences only"])
    return RankedStore(ranks)
