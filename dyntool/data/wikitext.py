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

Cache: ``<cache_dir>/wt-<key16>.cache.int32`` holds train|valid|test ids back to back and
``wt-<key16>.meta.json`` holds split lengths, the sha256 of the id bytes and the vocabulary.
``key`` = sha256 over the three files' sha256s (+ format version and ``oov``); a
``files.json`` fast path reuses a file's sha256 while its size and mtime_ns are unchanged.
Both files are written to a temp name and ``os.replace``d, ids first, meta last, so the meta
file is the commit marker: a killed build leaves no meta and is simply rebuilt; a corrupt or
truncated id file fails the checksum and is rebuilt.  Default ``cache_dir``: the user cache
directory, ``$XDG_CACHE_HOME/dyntool/wikitext/<sha(path)16>`` (``~/.cache`` when unset).  The
data folder is never written to (it may be shared or read-only by convention).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from dyntool.atomic import write_bytes
from dyntool.errors import DyntoolError

SPLITS = ("train", "valid", "test")
EOS = "<eos>"
UNK = "<unk>"
ENV_VAR = "DYNTOOL_WIKITEXT"
CACHE_VERSION = 1
_EXPECTED = "expected train.txt, valid.txt, test.txt (set --data.path)"


class DataError(DyntoolError, ValueError):
    """Missing or malformed data; the message is one line saying what was expected."""


@dataclass
class Corpus:
    train: np.ndarray          # (N_train,) int32 token ids
    valid: np.ndarray          # (N_valid,) int32
    test: np.ndarray           # (N_test,) int32
    vocab: list[str]           # id -> token
    stoi: dict[str, int]       # token -> id
    path: Path                 # the data directory
    cache_file: Path | None = None   # the int32 id file used (None when use_cache=False)

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
    return Path(__file__).resolve().parents[2]  # dyntool/data/wikitext.py -> repo


def resolve_data_dir(path: str | os.PathLike | None = None) -> Path:
    """Explicit ``path``; else ``../shared/data/wikitext-2`` from the repo root or cwd; else
    ``$DYNTOOL_WIKITEXT``.  Raises :class:`DataError` when none is a directory."""
    if path is not None:
        p = Path(path).expanduser()
        if not p.is_dir():
            raise DataError(f"wikitext-2 directory not found at {p}: {_EXPECTED}")
        return p
    tried = []
    for base in (_repo_root(), Path.cwd()):
        cand = (base / ".." / "shared" / "data" / "wikitext-2").resolve()
        if cand.is_dir():
            return cand
        tried.append(str(cand))
    env = os.environ.get(ENV_VAR)
    if env:
        p = Path(env).expanduser()
        if p.is_dir():
            return p
        tried.append(f"${ENV_VAR}={p}")
    where = ", ".join(dict.fromkeys(tried))
    raise DataError(f"wikitext-2 directory not found at {where}: {_EXPECTED}")


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/dyntool`` (``~/.cache/dyntool`` when unset or not absolute)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "dyntool"


def _default_cache_dir(data_dir: Path) -> Path:
    tag = hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:16]
    return user_cache_dir() / "wikitext" / tag


# ----------------------------------------------------------------------------- reading

def _read_split(data_dir: Path, name: str) -> bytes:
    f = data_dir / f"{name}.txt"
    if not f.is_file():
        raise DataError(f"wikitext-2 directory {data_dir} is missing {f.name}: {_EXPECTED}")
    raw = f.read_bytes()
    if not raw.strip():
        raise DataError(f"wikitext-2 file {f} is empty: expected word-level text, one line per "
                        f"paragraph (set --data.path)")
    return raw


def _decode(raw: bytes, f: Path) -> str:
    nul = raw.find(b"\x00")
    if nul >= 0:
        raise DataError(f"wikitext-2 file {f} looks binary (NUL byte at offset {nul}): expected "
                        f"UTF-8 word-level text (set --data.path)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"wikitext-2 file {f} is not UTF-8 (bad byte at offset {e.start}): "
                        f"expected UTF-8 word-level text (set --data.path)") from None
    # universal newlines, as text-mode iteration in data.py; NOT str.splitlines(), which would
    # also break on U+0085/U+2028 and change the token count
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _lines(text: str) -> list[str]:
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # a final "\n" ends the last line; it does not start a new one
    return lines


def tokenize(data_dir: Path, oov: str = "error"):
    """Read the three splits -> (dict of int32 arrays, vocab list).  No caching."""
    if oov not in ("error", "unk"):
        raise DataError(f"oov must be 'error' or 'unk', got {oov!r}")
    stoi: dict[str, int] = {}
    vocab: list[str] = []
    out: dict[str, np.ndarray] = {}
    for name in SPLITS:
        f = data_dir / f"{name}.txt"
        lines = _lines(_decode(_read_split(data_dir, name), f))
        ids: list[int] = []
        for lineno, line in enumerate(lines, 1):
            for w in line.split() + [EOS]:
                i = stoi.get(w)
                if i is None:
                    if name == "train":
                        i = stoi[w] = len(vocab)
                        vocab.append(w)
                    elif oov == "unk" and UNK in stoi:
                        i = stoi[UNK]
                    else:
                        raise DataError(f"{name}.txt line {lineno}: token {w!r} is not in the "
                                        f"train vocabulary: expected every valid/test token to "
                                        f"occur in train.txt (or use oov='unk')")
                ids.append(i)
        out[name] = np.asarray(ids, dtype=np.int32)
    return out, vocab


# ----------------------------------------------------------------------------- cache

def _atomic_write(path: Path, data: bytes) -> None:
    write_bytes(path, data, fsync=True, unique=True)   # ranks may write the shared cache at once


def _file_shas(data_dir: Path, cache_dir: Path) -> dict[str, str]:
    """sha256 of each split, reusing ``files.json`` entries whose size+mtime_ns still match."""
    index_path = cache_dir / "files.json"
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    shas, changed = {}, False
    for name in SPLITS:
        f = data_dir / f"{name}.txt"
        try:
            st = f.stat()
        except OSError:
            _read_split(data_dir, name)  # raises the one-line DataError
            raise
        ent = index.get(str(f.resolve()))
        if isinstance(ent, dict) and ent.get("size") == st.st_size and \
                ent.get("mtime_ns") == st.st_mtime_ns and isinstance(ent.get("sha256"), str):
            shas[name] = ent["sha256"]
            continue
        shas[name] = hashlib.sha256(_read_split(data_dir, name)).hexdigest()
        index[str(f.resolve())] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                   "sha256": shas[name]}
        changed = True
    if changed:
        try:
            _atomic_write(index_path, json.dumps(index, indent=1).encode())
        except OSError:
            pass  # the fast path is an optimisation only
    return shas


def _read_cache(ids_path: Path, meta_path: Path):
    """Return (splits, vocab) from a valid cache, or None if missing/corrupt."""
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        lengths = [int(meta["lengths"][s]) for s in SPLITS]
        vocab = meta["vocab"]
        buf = ids_path.read_bytes()
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if meta.get("version") != CACHE_VERSION or len(buf) != 4 * sum(lengths) or \
            hashlib.sha256(buf).hexdigest() != meta.get("ids_sha256") or \
            not isinstance(vocab, list) or len(vocab) != meta.get("vocab_size"):
        return None
    flat = np.frombuffer(buf, dtype="<i4").astype(np.int32, copy=False)
    if flat.size and (flat.min() < 0 or flat.max() >= len(vocab)):
        return None
    bounds = np.cumsum([0] + lengths)
    # copy so the arrays are writable and independent of the bytes object
    return {s: flat[bounds[i]:bounds[i + 1]].copy() for i, s in enumerate(SPLITS)}, vocab


def load_wikitext(path: str | os.PathLike | None = None, *, cache_dir: str | os.PathLike | None
                  = None, use_cache: bool = True, oov: str = "error") -> Corpus:
    """Load word-level WikiText-2 (or any dir with the same three files) as int32 ids.

    ``path``: data directory (see :func:`resolve_data_dir`).  ``cache_dir``: where the id cache
    lives (default: see module docstring).  ``use_cache=False`` always re-tokenises and writes
    nothing.  ``oov``: ``"error"`` (default) or ``"unk"``.
    """
    data_dir = resolve_data_dir(path)
    for name in SPLITS:  # fail early and clearly, before any cache lookup
        if not (data_dir / f"{name}.txt").is_file():
            raise DataError(f"wikitext-2 directory {data_dir} is missing {name}.txt: {_EXPECTED}")
    if not use_cache:
        splits, vocab = tokenize(data_dir, oov)
        return _corpus(splits, vocab, data_dir, None)

    cdir = Path(cache_dir).expanduser() if cache_dir is not None else _default_cache_dir(data_dir)
    try:
        cdir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DataError(f"cannot create cache directory {cdir} ({e.strerror}): expected a "
                        f"writable directory (set cache_dir or use_cache=False)") from None
    shas = _file_shas(data_dir, cdir)
    key = hashlib.sha256(json.dumps([CACHE_VERSION, oov, [shas[s] for s in SPLITS]])
                         .encode()).hexdigest()
    ids_path, meta_path = cdir / f"wt-{key[:16]}.cache.int32", cdir / f"wt-{key[:16]}.meta.json"

    hit = _read_cache(ids_path, meta_path)
    if hit is not None:
        return _corpus(*hit, data_dir, ids_path)

    splits, vocab = tokenize(data_dir, oov)
    flat = np.concatenate([splits[s] for s in SPLITS]).astype("<i4", copy=False)
    buf = flat.tobytes()
    meta = {"version": CACHE_VERSION, "key": key, "oov": oov, "source": str(data_dir),
            "file_sha256": shas, "lengths": {s: int(splits[s].size) for s in SPLITS},
            "ids_sha256": hashlib.sha256(buf).hexdigest(), "vocab_size": len(vocab),
            "vocab": vocab}
    try:
        _atomic_write(ids_path, buf)  # ids first; meta (with the checksum) commits the entry
        _atomic_write(meta_path, json.dumps(meta, ensure_ascii=False).encode("utf-8"))
    except OSError:
        pass  # an unwritable cache must not stop training; the data itself is fine
    return _corpus(splits, vocab, data_dir, ids_path if meta_path.exists() else None)


def _corpus(splits, vocab, data_dir, cache_file) -> Corpus:
    return Corpus(splits["train"], splits["valid"], splits["test"], list(vocab),
                  {w: i for i, w in enumerate(vocab)}, Path(data_dir), cache_file)


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
