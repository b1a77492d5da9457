"""Where a run lives: a local folder or an object-store URL, told apart in one place.

Every command takes the same kind of argument for a run or a folder of runs: a local path, an
``s3://bucket/prefix`` URL or a ``file:///abs/path`` URL.  :func:`location` turns the user's text
into a :class:`pathlib.Path` or a :class:`URLPath` once, and refuses (one line) what no part of
dyntool serves: an empty argument (which ``Path("")`` would silently read as the current folder),
another scheme (``gs://``, ``http://``; ``Path`` would collapse ``//`` and create a local
``gs:/bucket`` folder), a ``~user`` that does not exist.

A URL is never passed through :mod:`pathlib`: :class:`URLPath` has the part of ``Path``'s API the
readers use (``name``, ``parent``, ``/``, ``relative_to``, ``resolve``) and no ``__fspath__``, so
handing one to ``open()`` or ``Path()`` fails loudly instead of creating a local file from a URL.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import RunError

SCHEMES = ("s3://", "file://")
_ANY_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):/")


def is_url(p) -> bool:
    """An object-store location (``s3://``, ``file://``), given as text or as a :class:`URLPath`."""
    return isinstance(p, URLPath) or (isinstance(p, str) and p.startswith(SCHEMES))


def _strip(url: str) -> str:
    """``url`` without trailing slashes, but never above its root (``file:///``, ``s3://b``)."""
    u = str(url).rstrip("/")
    return "file:///" if u in ("file:", "file:/") else u


def join(url: str, *parts: str) -> str:
    base = _strip(url)
    tail = "/".join(p.strip("/") for p in parts if p.strip("/"))
    return base if not tail else (base + tail if base.endswith("/") else f"{base}/{tail}")


class URLPath:
    """An object-store location with the path API the readers need (see the module doc)."""

    __slots__ = ("url",)

    def __init__(self, url: str):
        self.url = _strip(url)

    def __str__(self) -> str:
        return self.url

    def __repr__(self) -> str:
        return f"URLPath({self.url!r})"

    def __eq__(self, other) -> bool:
        return isinstance(other, URLPath) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __lt__(self, other) -> bool:
        return str(self) < str(other)

    def __truediv__(self, part: str) -> "URLPath":
        return URLPath(join(self.url, str(part)))

    @property
    def root_len(self) -> int:
        """Characters of the bucket (``s3://bucket``) or of ``file://``: a URL never goes above it."""
        m = re.match(r"^s3://[^/]*", self.url)
        return m.end() if m else len("file://")

    @property
    def name(self) -> str:
        tail = self.url[self.root_len:]
        return tail.rsplit("/", 1)[-1] if tail.strip("/") else ""

    @property
    def parent(self) -> "URLPath":
        tail = self.url[self.root_len:]
        if "/" not in tail.strip("/"):
            return URLPath(self.url[:self.root_len] + ("/" if self.url.startswith("file://") else ""))
        return URLPath(self.url[:self.root_len] + tail.rsplit("/", 1)[0])

    def resolve(self) -> "URLPath":
        """Itself: a URL has no links to resolve (as ``Path.resolve`` gives a local path's real
        location, so code comparing locations needs no branch)."""
        return self

    def is_relative_to(self, other) -> bool:
        o = str(other).rstrip("/")
        return isinstance(other, URLPath) and (self.url == o or self.url.startswith(o + "/"))

    def relative_to(self, other) -> Path:
        if not self.is_relative_to(other):
            raise ValueError(f"{self.url} is not below {other}")
        return Path(self.url[len(_strip(other).rstrip("/")):].lstrip("/") or ".")


def location(text, what: str = "RUN") -> Path | URLPath:
    """The user's text as a local :class:`Path` or a :class:`URLPath`; one-line :class:`RunError`
    for an empty argument, an unserved scheme, a NUL byte or an unknown ``~user``."""
    if isinstance(text, (Path, URLPath)):
        return text
    text = str(text)
    if not text.strip():
        raise RunError(f"{what} is empty; give a folder, s3://bucket/prefix or file:///path")
    if "\x00" in text:
        raise RunError(f"{what} contains a NUL byte: {text!r}")
    if is_url(text):
        if text.startswith("s3://") and not text[5:].split("/", 1)[0]:
            raise RunError(f"{what} {text!r} names no bucket (use s3://bucket/prefix)")
        if text.startswith("file://") and not text[7:].startswith("/"):
            raise RunError(f"{what} {text!r}: a file:// URL needs an absolute path (file:///abs/path)")
        if ".." in text.split("://", 1)[1].split("/"):
            raise RunError(f"{what} {text!r}: '..' is not allowed in a URL (object keys have no parent links)")
        return URLPath(text)
    m = _ANY_SCHEME.match(text)
    if m and len(m.group(1)) > 1:           # one letter: a Windows drive, not a scheme
        raise RunError(f"{what} {text!r}: the scheme {m.group(1)}:// is not supported "
                       "(runs live in a local folder, s3://bucket/prefix or file:///path)")
    if text.startswith("~"):
        expanded = os.path.expanduser(text)
        if expanded.startswith("~"):
            raise RunError(f"{what} {text!r}: no such user {text[1:].split('/', 1)[0]!r}")
        return Path(expanded)
    return Path(text)
