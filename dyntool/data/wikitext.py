"""Word-level WikiText-2: loading, int32 token cache, and batching.

Tokenisation follows ``pytorch/examples/word_language_model/data.py`` exactly: every line of a
split (lines as Python text-mode iteration sees them, so only ``\\n`` / ``\\r`` end a line, never
U+0085 or U+2028) becomes ``line.split() + ["<eos>"]``.  Empty lines (``" \\n"`` in the release)
therefore contribute a lone ``<eos>``.  On the shared copy this gives 2,088,628 / 217,646 /
245,569 tokens and a train vocabulary of **33,278** types (33,277 words + ``<eos>``).

Vocabulary: built from train only, ids in order of first occurrence (so ids are reproducible and
match ``data.py``).  Valid/test tokens absent from train are an error by default
(``oov="error"``: a one-line :class:`DataError` naming split, line and token), because the
real data has none and a silent ``<unk>`` mapping would hide a wrong file.  ``oov="unk"`` maps
them to ``<unk>`` (which must be in the train vocabulary) for other corpora.

Sources (:mod:`dyntool.data.sources`): a folder of the three text files, a folder of the hub's
parquet files (``wikitext-2-v1/{train,validation,test}-*.parquet``, one row per line) or a hub id
``hf:Salesforce/wikitext[/CONFIG]`` read through the Hugging Face cache; all give the same ids.

Cache: ``<cache_dir>/wt-<key16>.ids.npy`` holds train|valid|test ids back to back (int32, ``.npy``,
handed out memory-mapped, so a wikitext-103-sized corpus costs page cache, not RSS) and
``wt-<key16>.meta.json`` holds split lengths, the sha256 of the id bytes and the vocabulary.
``key`` = sha256 over the source files' sha256s (+ format version and ``oov``); a
``files.json`` fast path reuses a file's sha256 while its size and mtime_ns are unchanged.
Both files are written to a temp name and ``os.replace``d, ids first, meta last, so the meta
file is the commit marker: a killed build leaves no meta and is simply rebuilt; a corrupt or
truncated id file fails the checksum and is rebuilt.  Default ``cache_dir``: the user cache
directory, ``$XDG_CACHE_HOME/dyntool/wikitext/<sha(path)16>`` (``~/.cache`` when unset).  The
data folder is never written to (it may be shared, read-only, or the Hugging Face cache).
"""
from __future__ import annotations

import hashlib
import json
import os
from array import array
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from dyntool.atomic import replacing, write_bytes
from dyntool.data import sources
from dyntool.data.sources import ENV_VAR, SPLITS, DataError, Source

EOS = "<eos>"
UNK = "<unk>"
CACHE_VERSION = 2                  # 2: ids as .npy (memory-mapped); 1 was a raw .cache.int32
_EXPECTED = sources.EXPECTED
__all__ = ["DataError", "Corpus", "load_wikitext", "resolve_source", "resolve_data_dir", "get_batch",
           "fixed_batch", "eval_batches", "tokenize"]


@dataclass
class Corpus:
    train: np.ndarray          # (N_train,) int32 token ids
    valid: np.ndarray          # (N_valid,) int32
    test: np.ndarray           # (N_test,) int32
    vocab: list[str]           # id -> token
    stoi: dict[str, int]       # token -> id
    path: Path                 # the folder the files were read from
    cache_file: Path | None = None   # the .npy id file used (None when use_cache=False)
    source: str = ""           # what was asked for: a path or a hub id

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise DataError(f"unknown split {name!r}: expected one of {', '.join(SPLITS)}")
        return getattr(self, name)

    def decode(self, ids) -> str:
        """Ids -> text in the release's line format (`` w1 w2 \\n`` per ``<eos>``)."""
        out, line = [], []
        for i in np.asarray(ids).reshape(-1).tolist():
            tok = self.vocab[i]
            if tok == EOS:
                out.append(" " + " ".join(line) + " \n" if line else " \n")
                line = []
            else:
                line.append(tok)
        if line:  # trailing partial line (no <eos> yet)
            out.append(" " + " ".join(line))
        return "".join(out)


# ----------------------------------------------------------------------------- paths

def _repo_root() -> Path:
    return sources.repo_root()


def resolve_data_dir(path: str | os.PathLike | None = None) -> Path:
    """The local data folder: explicit ``path``; else ``../shared/data/wikitext-2`` from the repo
    root or cwd; else ``$DYNTOOL_WIKITEXT``.  Raises :class:`DataError` when none is a directory
    (:func:`load_wikitext` then turns to the hub id)."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_dir():
            raise DataError(f"wikitext-2 directory not found at {p}: {_EXPECTED}")
        return p
    found, tried = _local_default()
    if found is None:
        raise DataError(f"wikitext-2 directory not found at {', '.join(tried)}: {_EXPECTED}")
    return found


def _local_default():
    tried = []
    for base in (_repo_root(), Path.cwd()):
        cand = (base / ".." / "shared" / "data" / "wikitext-2").resolve()
        if cand.is_dir():
            return cand, tried
        tried.append(str(cand))
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            return p, tried
        tried.append(f"${ENV_VAR}={p}")
    return None, list(dict.fromkeys(tried))


def resolve_source(path: str | os.PathLike | None = None, log=None) -> Source:
    """``--data.path`` → :class:`~dyntool.data.sources.Source`: a folder of text files, a folder
    of the hub's parquet files, or ``hf:OWNER/NAME[/CONFIG]``; with none the local default
    (:func:`resolve_data_dir`), else the hub id ``hf:Salesforce/wikitext``."""
    if path is None or str(path) == "":
        found, tried = _local_default()
        if found is not None:
            return sources.local_source(found)
        try:
            return sources.hub_source(sources.HUB_DEFAULT, log)
        except DataError as e:
            raise DataError(f"no WikiText found: no folder at {', '.join(tried) or '(none tried)'} and "
                            f"{e}; or point ${ENV_VAR} at a folder of train.txt, valid.txt, test.txt; "
                            f"{_first_try()}") from None
    return sources.resolve(path, log)


def _first_try() -> str:
    """The bundled test corpus as the way to a first run without WikiText (a checkout has it; an
    installed wheel does not ship tests/, so then it is named as a checkout's folder)."""
    tiny = _repo_root() / "tests" / "data" / "tiny_wikitext"
    if (tiny / "train.txt").is_file():
        return f"a first try without WikiText: --data.path={tiny}"
    return "a first try without WikiText: --data.path=tests/data/tiny_wikitext of a dyntool checkout"


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dyntool`` (``~/.cache/dyntool`` when unset or not absolute)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "dyntool"


def _default_cache_dir(data_dir: Path) -> Path:
    tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return user_cache_dir() / "wikitext" / tag


# ----------------------------------------------------------------------------- tokenizing

def tokenize(data: Source | str | os.PathLike, oov: str = "error"):
    """Read the three splits -> (dict of int32 arrays, vocab list).  No caching.

    Streams line by line into 4-byte ids (``array('i')``), so a wikitext-103-sized corpus never
    becomes a Python list of ints."""
    if oov not in ("error", "unk"):
        raise DataError(f"oov must be 'error' or 'unk', got {oov!r}")
    src = data if isinstance(data, Source) else sources.local_source(data)
    stoi: dict[str, int] = {}
    out: dict[str, np.ndarray] = {}
    for name in SPLITS:
        buf, words = array("i"), False
        if name == "train":
            add = stoi.setdefault
            for line in sources.lines(src, name):
                ws = line.split()
                words = words or bool(ws)
                ws.append(EOS)
                buf.extend([add(w, len(stoi)) for w in ws])
        else:
            get, unk = stoi.get, stoi.get(UNK) if oov == "unk" else None
            for lineno, line in enumerate(sources.lines(src, name), 1):
                ws = line.split()
                words = words or bool(ws)
                ws.append(EOS)
                ids = [get(w, -1) for w in ws]
                if -1 in ids:
                    if unk is None:
                        w = ws[ids.index(-1)]
                        where = f"{name}.txt line" if src.kind == "text" else f"{name} split, row"
                        raise DataError(f"{where} {lineno}: token {w!r} is not in the train vocabulary: "
                                        f"expected every valid/test token to occur in the train split "
                                        f"(or use oov='unk')")
                    ids = [unk if i < 0 else i for i in ids]
                buf.extend(ids)
        if not words:
            f = src.files[name][0]
            raise DataError(f"wikitext-2 file {f} is empty: expected word-level text, one line per "
                            f"paragraph (set --data.path)")
        out[name] = np.frombuffer(buf, dtype=np.int32) if buf.itemsize == 4 else \
            np.asarray(buf, dtype=np.int32)
    return out, list(stoi)


# ----------------------------------------------------------------------------- cache

def _file_shas(files: list[Path], cache_dir: Path) -> list[str]:
    """sha256 of each file, reusing ``files.json`` entries whose size+mtime_ns still match."""
    index_path = cache_dir / "files.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    shas, changed = [], False
    for f in files:
        try:
            st = f.stat()
        except OSError as e:
            raise DataError(f"cannot read {f} ({e.strerror}): {_EXPECTED}") from None
        ent = index.get(str(f.resolve()))
        if isinstance(ent, dict) and ent.get("size") == st.st_size and \
                ent.get("mtime_ns") == st.st_mtime_ns and isinstance(ent.get("sha256"), str):
            shas.append(ent["sha256"])
            continue
        shas.append(_sha_file(f))
        index[str(f.resolve())] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": shas[-1]}
        changed = True
    if changed:
        try:
            write_bytes(index_path, json.dumps(index, indent=1).encode(), unique=True)
        except OSError:
            pass  # the fast path is an optimisation only
    return shas


def _sha_file(f: Path, offset: int = 0) -> str:
    """sha256 of a file's bytes from ``offset`` on, read in 16 MB pieces (page cache, not RSS)."""
    h = hashlib.sha256()
    with open(f, "rb") as fh:
        fh.seek(offset)
        while chunk := fh.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def _read_cache(ids_path: Path, meta_path: Path):
    """Return (splits as memory-mapped views, vocab) from a valid cache, or None if missing/corrupt."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        lengths = [int(meta["lengths"][s]) for s in SPLITS]
        vocab = meta["vocab"]
        flat = np.load(ids_path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if meta.get("version") != CACHE_VERSION or flat.dtype != np.dtype("<i4") or flat.ndim != 1 or \
            flat.shape[0] != sum(lengths) or not isinstance(vocab, list) or \
            len(vocab) != meta.get("vocab_size") or \
            _sha_file(ids_path, flat.offset) != meta.get("ids_sha256"):
        return None
    bounds = np.cumsum([0] + lengths)
    return {s: flat[bounds[i]:bounds[i + 1]] for i, s in enumerate(SPLITS)}, vocab


def _write_cache(ids_path: Path, meta_path: Path, splits: dict, meta: dict) -> None:
    """ids (.npy) first, then the meta file with their checksum: the meta commits the entry."""
    n = sum(int(splits[s].size) for s in SPLITS)
    h = hashlib.sha256()
    with replacing(ids_path, unique=True) as tmp, open(tmp, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<i4", "fortran_order": False, "shape": (n,)})
        for s in SPLITS:                  # written as it is, not through a map (no pages in RSS)
            a = memoryview(np.ascontiguousarray(splits[s], dtype="<i4")).cast("B")
            fh.write(a)
            h.update(a)
        fh.flush()
        os.fsync(fh.fileno())
    meta["ids_sha256"] = h.hexdigest()
    write_bytes(meta_path, json.dumps(meta, ensure_ascii=False).encode("utf-8"), fsync=True, unique=True)


def load_wikitext(path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None
                  = None, use_cache: bool = True, oov: str = "error", log=None) -> Corpus:
    """Load word-level WikiText (see :func:`resolve_source` for ``path``) as int32 ids.

    ``cache_dir``: where the id cache lives (default: see module docstring).  ``use_cache=False``
    always re-tokenises and writes nothing.  ``oov``: ``"error"`` (default) or ``"unk"``.
    ``log``: called with one line saying what is read and where the ids are cached.
    """
    src = resolve_source(path, log)
    if not use_cache:
        return _corpus(*tokenize(src, oov), src, None)
    cdir = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache_dir(src.root)
    try:
        cdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {cdir} ({e.strerror}): expected a "
                        f"writable directory (set cache_dir or use_cache=False)") from None
    if log is not None:
        log(f"data: {src.describe()}; token ids cached in {cdir}")
    shas = _file_shas(src.all_files(), cdir)
    key = hashlib.sha256(json.dumps([CACHE_VERSION, oov, shas]).encode()).hexdigest()
    ids_path, meta_path = cdir / f"wt-{key[:16]}.ids.npy", cdir / f"wt-{key[:16]}.meta.json"

    hit = _read_cache(ids_path, meta_path)
    if hit is not None:
        return _corpus(*hit, src, ids_path)
    if log is not None:
        log("data: tokenizing (first use of these files; later runs read the cache)")
    splits, vocab = tokenize(src, oov)
    meta = {"version": CACHE_VERSION, "key": key, "oov": oov, "source": str(src.root),
            "kind": src.kind, "file_sha256": shas, "lengths": {s: int(splits[s].size) for s in SPLITS},
            "vocab_size": len(vocab), "vocab": vocab}
    try:
        _write_cache(ids_path, meta_path, splits, meta)
    except OSError:
        return _corpus(splits, vocab, src, None)   # an unwritable cache must not stop training
    hit = _read_cache(ids_path, meta_path)           # hand out the memory-mapped ids, not the lists
    return _corpus(*hit, src, ids_path) if hit is not None else _corpus(splits, vocab, src, None)


def _corpus(splits, vocab, src: Source, cache_file) -> Corpus:
    return Corpus(splits["train"], splits["valid"], splits["test"], list(vocab),
                  {w: i for i, w in enumerate(vocab)}, Path(src.root), cache_file, src.label or str(src.root))


# ----------------------------------------------------------------------------- batching

def _check_len(data: np.ndarray, block_size: int, need: int = 1) -> int:
    n = len(data)
    if block_size < 1 or n < block_size + need:
        raise DataError(f"split has {n} tokens: expected at least block_size+{need} = "
                        f"{block_size + need} (lower block_size)")
    return n


def _to_xy(data: np.ndarray, starts: np.ndarray, block_size: int, device) -> tuple:
    idx = starts[:, None] + np.arange(block_size + 1)[None, :]        # (B, T+1)
    win = torch.from_numpy(np.asarray(data)[idx].astype(np.int64))    # (B, T+1)
    x, y = win[:, :-1], win[:, 1:]                                    # y = x shifted by one
    device = torch.device(device)
    if device.type == "cuda":  # pinned + non_blocking overlaps the copy with compute
        return (x.contiguous().pin_memory().to(device, non_blocking=True),
                y.contiguous().pin_memory().to(device, non_blocking=True))
    return x.contiguous().to(device), y.contiguous().to(device)


def get_batch(data: np.ndarray, batch_size: int, block_size: int,
              generator: torch.Generator | np.random.Generator | None = None,
              device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT-style random windows: ``(x, y)`` int64 ``(B, T)``, ``y[:, t] = x[:, t+1]``."""
    n = _check_len(data, block_size)
    hi = n - block_size  # start s needs s + T < n
    if isinstance(generator, np.random.Generator):
        starts = generator.integers(0, hi, size=batch_size)
    else:
        starts = torch.randint(hi, (batch_size,), generator=generator).numpy()
    return _to_xy(data, starts.astype(np.int64), block_size, device)


def fixed_batch(data: np.ndarray, batch_size: int, block_size: int, offset: int = 0,
                device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Deterministic windows for a probe batch: ``batch_size`` starts spread evenly over
    ``[offset, len - block_size - 1]`` (the same tokens every call)."""
    n = _check_len(data, block_size)
    last = n - block_size - 1
    if not 0 <= offset <= last:
        raise DataError(f"offset {offset} out of range: expected 0 <= offset <= {last}")
    b = np.arange(batch_size, dtype=np.int64)
    starts = offset + (b * (last - offset)) // max(batch_size - 1, 1)
    return _to_xy(data, starts, block_size, device)


def eval_batches(data: np.ndarray, batch_size: int, block_size: int,
                 max_batches: int | None = None, device: str | torch.device = "cpu",
                 include_tail: bool = True) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Non-overlapping windows covering a whole split, ``batch_size`` at a time.

    Window w has inputs ``data[wT:(w+1)T]``; every token except the first is a target exactly
    once.  With ``include_tail`` the leftover ``(len-1) % T`` targets come as a final ``(1, r)``
    batch, so summing token losses over all batches gives the exact split perplexity
    (``len(data) - 1`` targets).  ``max_batches`` caps the number of batches (the tail included).
    """
    n = _check_len(data, 1)
    n_win = (n - 1) // block_size
    starts = np.arange(n_win, dtype=np.int64) * block_size
    count = 0
    for i in range(0, n_win, batch_size):
        if max_batches is not None and count >= max_batches:
            return
        yield _to_xy(data, starts[i:i + batch_size], block_size, device)
        count += 1
    r = (n - 1) - n_win * block_size
    if include_tail and r > 0 and (max_batches is None or count < max_batches):
        yield _to_xy(data, np.array([n_win * block_size]), r, device)
