"""Where WikiText comes from: a folder of text files, a folder of the hub's parquet files, or a hub id.

``--data.path`` (config ``data.path``) takes

- a folder holding ``train.txt``, ``valid.txt``, ``test.txt`` (word-level, tokenized: the
  ``wikitext-2`` release as ``pytorch/examples`` uses it);
- a folder laid out like the hub repository ``Salesforce/wikitext``:
  ``wikitext-2-v1/{train,validation,test}-00000-of-00001.parquet`` (one column ``text``, one row
  per line of the tokenized files), as ``hf download Salesforce/wikitext --repo-type dataset
  --local-dir DIR`` leaves it, or ``DIR/wikitext-2-v1`` itself (any config folder, e.g.
  ``wikitext-103-v1``, whose train split comes in several shards);
- a hub id ``hf:Salesforce/wikitext`` (config ``wikitext-2-v1``) or ``hf:Salesforce/wikitext/CONFIG``:
  ``huggingface_hub.snapshot_download`` fetches that config's parquet files into the user's
  Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)
  and, with ``HF_HUB_OFFLINE=1``, reads the cached snapshot without touching the network.

With no path: the shared copy (``../shared/data/wikitext-2`` from the repository or the working
directory), else ``$DYNTOOL_WIKITEXT``, else the hub id.  Every problem is one :class:`DataError`
line saying what was found and what was expected.  Nothing here writes to a data folder.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .. import safeio
from ..errors import DyntoolError

SPLITS = ("train", "valid", "test")
PARQUET_SPLIT = {"train": "train", "valid": "validation", "test": "test"}
HUB_PREFIX = "hf:"
HUB_REPO = "Salesforce/wikitext"
HUB_CONFIG = "wikitext-2-v1"
HUB_DEFAULT = f"{HUB_PREFIX}{HUB_REPO}"
HUB_CONFIGS = ("wikitext-2-v1", "wikitext-103-v1")        # the word-level tokenized configs
ENV_VAR = "DYNTOOL_WIKITEXT"
FETCH = f"hf download {HUB_REPO} --repo-type dataset --include '{HUB_CONFIG}/*'"
EXPECTED = "expected train.txt, valid.txt, test.txt (set --data.path)"
PARQUET_EXPECTED = ("expected a folder with train.txt, valid.txt, test.txt or the hub layout "
                    f"{HUB_CONFIG}/{{train,validation,test}}-*.parquet (set --data.path, or "
                    f"--data.path={HUB_DEFAULT})")


class DataError(DyntoolError, ValueError):
    """Missing or malformed data; the message is one line saying what was expected."""


@dataclass
class Source:
    """Resolved data: ``kind`` ``"text"`` or ``"parquet"``, the folder ``root`` holding the files,
    and per split the files to read (several parquet shards for a large split)."""
    kind: str
    root: Path
    files: dict[str, list[Path]] = field(default_factory=dict)
    label: str = ""                 # what the user named (a path or a hub id), for messages

    def __post_init__(self):
        # before a byte is hashed or read: a FIFO or a link to /dev/zero would hang, a folder crash
        for f in self.all_files():
            try:
                safeio.check_regular(f, f"wikitext-2 file {f}")
            except safeio.BadFile as e:
                raise DataError(f"{e} (set --data.path)") from None
            except OSError as e:
                raise DataError(f"wikitext-2 file {f} can't be read ({e.strerror or e})") from None

    def all_files(self) -> list[Path]:
        return [f for s in SPLITS for f in self.files[s]]

    def describe(self) -> str:
        size = sum(f.stat().st_size for f in self.all_files())
        what = "text files" if self.kind == "text" else "parquet files"
        via = f"{self.label} -> " if self.label and self.label != str(self.root) else ""
        return f"{via}{self.root} ({what}, {size / 2**20:.1f} MB)"


# ----------------------------------------------------------------------------- locating

def repo_root() -> Path:
    """The dyntool checkout this module runs from (where `../shared/data` and `tests/data` are looked for)."""
    return Path(__file__).resolve().parents[2]  # dyntool/data/sources.py -> repo


def _parquet_shards(folder: Path, split: str) -> list[Path]:
    return sorted(folder.glob(f"{PARQUET_SPLIT[split]}-*.parquet"))


def _found(folder: Path) -> str:
    try:
        names = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir())
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not names:
        return "nothing (empty folder)"
    if len(names) > 3:                      # a whole folder listed is no help in one line (e.g. /etc)
        return f"{len(names)} entries, none of them WikiText's"
    return ", ".join(names)


def _parquet_source(folder: Path, label: str) -> Source:
    files, missing = {}, []
    for s in SPLITS:
        shards = _parquet_shards(folder, s)
        if not shards:
            missing.append(f"{PARQUET_SPLIT[s]}-*.parquet")
        files[s] = shards
    if missing:
        raise DataError(f"parquet folder {folder} has no {', '.join(missing)} (found {_found(folder)}): "
                        f"expected train-, validation- and test-*.parquet (set --data.path)")
    return Source("parquet", folder, files, label)


def local_source(path: str | os.PathLike, label: str | None = None) -> Source:
    """A folder of text files, a parquet config folder, or a folder holding config folders."""
    p = Path(path).expanduser()
    label = label if label is not None else str(path)
    if not p.is_dir():
        what = "a file" if p.exists() else "nothing"
        raise DataError(f"wikitext-2 directory not found at {p} (found {what} there): expected a folder "
                        f"of train.txt, valid.txt, test.txt or of the hub's parquet files, or a hub id "
                        f"(set --data.path, e.g. --data.path={HUB_DEFAULT})")
    texts = [s for s in SPLITS if (p / f"{s}.txt").is_file()]
    if texts:
        if len(texts) < 3:
            miss = next(s for s in SPLITS if s not in texts)
            raise DataError(f"wikitext-2 directory {p} is missing {miss}.txt: {EXPECTED}")
        return Source("text", p, {s: [p / f"{s}.txt"] for s in SPLITS}, label)
    if any(p.glob("*.parquet")):
        return _parquet_source(p, label)
    configs = sorted(c.name for c in p.iterdir() if c.is_dir() and any(c.glob("*.parquet")))
    if HUB_CONFIG in configs:
        return _parquet_source(p / HUB_CONFIG, label)
    if len(configs) == 1:
        return _parquet_source(p / configs[0], label)
    if configs:
        raise DataError(f"{p} holds several configs ({', '.join(configs)}): expected one; name it, "
                        f"e.g. --data.path={p / configs[0]}")
    raise DataError(f"{p} has neither layout (found {_found(p)}): {PARQUET_EXPECTED}")


def parse_hub(spec: str) -> tuple[str, str]:
    """``hf:OWNER/NAME[/CONFIG]`` → (repo id, config)."""
    parts = [x for x in spec[len(HUB_PREFIX):].strip("/").split("/") if x]
    if len(parts) not in (2, 3):
        raise DataError(f"hub id {spec!r} is malformed: expected {HUB_DEFAULT} or {HUB_DEFAULT}/CONFIG")
    repo = "/".join(parts[:2])
    config = parts[2] if len(parts) == 3 else HUB_CONFIG
    import difflib                     # a near miss of the known id is a typo: say so, download nothing
    if repo != HUB_REPO and difflib.get_close_matches(repo.lower(), [HUB_REPO.lower()], n=1, cutoff=0.8):
        raise DataError(f"hub id {spec!r}: {repo!r} looks like a typo of {HUB_REPO!r}; did you mean "
                        f"{HUB_PREFIX}{HUB_REPO}{'/' + config if len(parts) == 3 else ''}? (nothing was downloaded)")
    if repo == HUB_REPO and config not in HUB_CONFIGS:
        raise DataError(f"unknown config {config!r} of {repo}: expected one of {', '.join(HUB_CONFIGS)} "
                        f"(the word-level tokenized configs), e.g. {HUB_DEFAULT}/wikitext-103-v1")
    return repo, config


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache, read from the environment at call time (as the client does)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "huggingface" / "hub"


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


HUB_PROBE_S = 5.0       # a hub that has not answered one request by then won't serve a download


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "").rstrip("/") or "https://huggingface.co"


def _hub_answers(timeout: float = HUB_PROBE_S) -> bool:
    """Whether the hub answers one HTTP request within ``timeout`` (any status counts).  A silent
    or firewalled endpoint otherwise holds the client for minutes (its retries each wait); the
    request runs in a daemon thread so a hanging name lookup is bounded too."""
    import threading
    import urllib.error
    import urllib.request
    answered = threading.Event()

    def ask():
        try:
            with urllib.request.urlopen(_endpoint(), timeout=timeout):
                pass
            answered.set()
        except urllib.error.HTTPError:            # a status, even 4xx/5xx, is an answer
            answered.set()
        except Exception:                           # refused, timed out, no such host, bad URL
            pass
    t = threading.Thread(target=ask, daemon=True, name="dyntool-hub-probe")
    t.start()
    t.join(timeout + 0.5)
    return answered.is_set()


def hub_source(spec: str, log=None) -> Source:
    """Fetch (or, offline, find in the cache) the config's parquet files of a hub dataset."""
    repo, config = parse_hub(spec)
    name = f"{HUB_PREFIX}{repo}/{config}"
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise DataError(f"{name} needs huggingface_hub (pip install 'dyntool[data]'); or set "
                        f"--data.path to a folder of the data") from None
    cache = hub_cache_dir()
    offline = _offline()
    silent = not offline and not _hub_answers()
    if silent:                        # only the cache can help; asking the client would hang on it
        offline = True
    if log is not None:
        log(f"data: {name} from the Hugging Face cache {cache}"
            f"{f' only (the hub did not answer within {HUB_PROBE_S:.0f} s)' if silent else ' (offline)' if offline else ', downloading what is missing'}")
    try:
        snap = snapshot_download(repo, repo_type="dataset", allow_patterns=[f"{config}/*"],
                                 cache_dir=str(cache), local_files_only=offline, etag_timeout=5)
    except Exception as e:            # offline/unreachable/not found: one line, whatever the client raised
        why = (f"the hub ({_endpoint()}) did not answer within {HUB_PROBE_S:.0f} s" if silent
               else "HF_HUB_OFFLINE=1" if offline else f"the hub can't be reached ({type(e).__name__})")
        raise DataError(f"cannot get {name}: not in the Hugging Face cache {cache} and {why}: fetch it "
                        f"with `{FETCH.replace(HUB_CONFIG, config)}` or set --data.path to a folder "
                        f"of the data") from None
    folder = Path(snap) / config
    if not folder.is_dir():
        raise DataError(f"{name}: the snapshot {snap} has no {config}/ (found {_found(Path(snap))}): "
                        f"expected {config}/{{train,validation,test}}-*.parquet")
    return _parquet_source(folder, name)


def resolve(spec: str | os.PathLike, log=None) -> Source:
    """A non-empty ``--data.path``: a hub id or a local folder (the default is the loader's)."""
    if str(spec).startswith(HUB_PREFIX):
        return hub_source(str(spec), log)
    return local_source(spec)


# ----------------------------------------------------------------------------- reading lines

def _text_lines(f: Path) -> Iterator[str]:
    """Lines as text-mode iteration sees them (universal newlines, as ``data.py``: never U+0085 or
    U+2028); binary or non-UTF-8 files are a one-line error."""
    try:
        with open(f, encoding="utf-8", newline=None) as fh:
            for line in fh:
                if "\x00" in line:
                    raise DataError(f"wikitext-2 file {f} looks binary (NUL byte): expected UTF-8 "
                                    f"word-level text (set --data.path)")
                yield line
    except UnicodeDecodeError:
        raw = f.read_bytes()
        try:
            raw.decode("utf-8")
            at = "?"
        except UnicodeDecodeError as e:
            at = e.start
        nul = raw.find(b"\x00")
        if nul >= 0:
            raise DataError(f"wikitext-2 file {f} looks binary (NUL byte at offset {nul}): "
                            f"expected UTF-8 word-level text (set --data.path)") from None
        raise DataError(f"wikitext-2 file {f} is not UTF-8 (bad byte at offset {at}): expected UTF-8 "
                        f"word-level text (set --data.path)") from None


def _parquet_lines(f: Path) -> Iterator[str]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {f} needs pyarrow (pip install 'dyntool[data]')") from None
    try:
        pf = pq.ParquetFile(f)
        cols = pf.schema_arrow.names
    except Exception as e:
        raise DataError(f"{f} is not a readable parquet file ({type(e).__name__}): expected the hub's "
                        f"parquet with a 'text' column") from None
    if "text" not in cols:
        raise DataError(f"{f} has columns {', '.join(cols) or '(none)'}: expected a 'text' column "
                        f"(one row per line of the tokenized text)")
    kind = pf.schema_arrow.field("text").type
    if str(kind) not in ("string", "large_string"):
        raise DataError(f"{f}: its 'text' column holds {kind}, expected strings (one row per line of the "
                        f"tokenized text)")
    batches = pf.iter_batches(columns=["text"], batch_size=65536)
    while True:                             # batch by batch: a wikitext-103 split is never held whole
        try:
            b = next(batches, None)
            rows = None if b is None else b.column(0).to_pylist()
        except Exception as e:              # a damaged page: bad compression, bad UTF-8, a short file
            raise DataError(f"{f} is damaged ({type(e).__name__}: {' '.join(str(e).split())[:120]}): "
                            f"expected the hub's parquet with a 'text' column") from None
        if rows is None:
            return
        for line in rows:
            yield line or ""


def lines(source: Source, split: str) -> Iterator[str]:
    """Every line of ``split`` (all its shards, in order)."""
    for f in source.files[split]:
        yield from (_text_lines(f) if source.kind == "text" else _parquet_lines(f))
