"""Typed, namespaced configuration (minGPT-style), loadable from TOML with presets.

A config is a tree of dataclasses.  Leaves are ``int, float, bool, str``, ``list`` of
those, or ``Optional`` of those.  Values come, in increasing priority, from the dataclass
defaults, a TOML file (top-level tables = sections), a ``[preset.NAME]`` table in that file,
and ``--section.key=value`` command-line overrides (or typed ``values`` from named flags).

This module is the one validation layer every schema goes through:

- types: unknown keys and values of the wrong type raise :class:`ConfigError` naming the full
  dotted key;
- every float is finite (``1e400`` parses as inf and is refused);
- bounds and choices are declared on the field's annotation, e.g. ``d_k: Annotated[int, Range(1)]``
  or the aliases :data:`Seed` (the RNG range ``0 .. 2**32 - 1`` that numpy and torch both accept),
  :data:`Device`;
- cross-field rules live in each schema's ``validate(prefix)``, called after every update;
- renamed keys: a schema's ``RENAMED = {"old": "new"}`` (a ClassVar) keeps the old key working in
  TOML files, presets and ``--overrides`` with one :class:`DeprecatedKeyWarning` line, and silently
  in a run's recorded ``config.json`` (``base``), so old runs still resume.

Preset files ship inside the package (``dyntool/presets/*.toml``); :func:`resolve_file` finds
them by name (``--config sticky_markov``) or by their old repository path (``sims/NAME.toml``).
"""
from __future__ import annotations

import dataclasses
import difflib
import tomllib
import typing
import warnings
from pathlib import Path
from typing import Any

from .config_values import (SEED_MAX, Device, NonNegFloat, NonNegInt, Pattern, PosFloat,  # noqa: F401
                            PosInt, Range, Seed, coerce, leaf_type)
from .errors import ConfigError

PRESETS = Path(__file__).resolve().parent / "presets"


def _hints(cls: type) -> dict[str, Any]:
    """The annotations of a schema's fields (not its ClassVars or InitVars); none for a leaf type."""
    if not dataclasses.is_dataclass(cls):
        return {}
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in typing.get_type_hints(cls, include_extras=True).items() if k in names}


class DeprecatedKeyWarning(FutureWarning):
    """A config key given under its old name (still accepted)."""


def renamed(cls: Any) -> dict[str, str]:
    """A schema's renamed keys, old name -> new name."""
    return dict(getattr(cls, "RENAMED", {}) or {})


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default


def rename(cls: type, tree: dict[str, Any], prefix: str = "", warn: bool = True) -> dict[str, Any]:
    """``tree`` (nested values for schema ``cls``) with every old key under its new name.

    Both names in one tree: a value left at the default yields to the other (a recorded
    config.json holds both, one of them unset); two different settings are refused."""
    out = dict(tree)
    for old, new in renamed(cls).items():
        if old not in out:
            continue
        value = out.pop(old)
        if warn:
            warnings.warn(f"config key {prefix}{old} is deprecated, use {prefix}{new}", DeprecatedKeyWarning,
                          stacklevel=3 + prefix.count("."))       # the caller of load()
        if new in out and out[new] != value:
            unset = _default(cls, new)
            if value == unset:
                continue
            if out[new] != unset:
                raise ConfigError(prefix + new, f"{prefix}{old} is its older name; give one of them")
        out[new] = value
    hints = _hints(cls)
    for name, value in out.items():
        tp = hints.get(name)
        if isinstance(value, dict) and tp is not None and dataclasses.is_dataclass(tp):
            out[name] = rename(tp, value, prefix + name + ".", warn)
    return out


def _unknown_key(key: str, name: str, names, prefix: str) -> ConfigError:
    """The error for a key a section doesn't have, with the closest known key when one is close."""
    close = difflib.get_close_matches(name, sorted(names), n=1, cutoff=0.6)
    hint = f"did you mean {prefix}{close[0]}? " if close else ""
    return ConfigError(key, f"unknown key; {hint}(known: {', '.join(sorted(names))})")


def update(cfg: Any, values: dict[str, Any], prefix: str = "") -> Any:
    """Return a copy of dataclass ``cfg`` with nested ``values`` applied (validated)."""
    hints = _hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    changes = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise _unknown_key(key, name, names, prefix)
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(key, "is a section; set its keys as " + key + ".KEY=VALUE")
            changes[name] = update(current, value, prefix=key + ".")
        else:
            changes[name] = coerce(key, hints[name], value)
    try:
        new = dataclasses.replace(cfg, **changes)
    except (ValueError, TypeError) as e:             # a schema that checks itself in __post_init__
        raise ConfigError(prefix.rstrip(".") or type(cfg).__name__, str(e)) from None
    validate = getattr(new, "validate", None)
    if callable(validate):
        validate(prefix)
    return new


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--model.n_head=4", "--seed=1"]`` → ``{"model": {"n_head": "4"}, "seed": "1"}``."""
    out: dict[str, Any] = {}
    for arg in args:
        if not arg.startswith("--") or "=" not in arg:
            raise ConfigError(arg, "overrides look like --section.key=value")
        dotted, value = arg[2:].split("=", 1)
        parts = dotted.replace("-", "_").split(".")
        node = out
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(dotted, "set twice as a value and a section")
        node[parts[-1]] = value
    return out


def _check_sections(cfg: Any, tree: dict, prefix: str = "") -> None:
    """Every ``--a.b=c`` names a key of a section: ``--steps.x=1`` (``steps`` is a value) or an
    unknown section is refused with the key, never dropped."""
    names = {f.name: f for f in dataclasses.fields(cfg)}
    for name, value in tree.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise _unknown_key(key, name, names, prefix)
        current = getattr(cfg, name)
        if isinstance(value, dict):
            if not dataclasses.is_dataclass(current):
                sub_key = next(iter(value), "")
                raise ConfigError(f"{key}.{sub_key}", f"{key} is a value, not a section (set it as --{key}=VALUE)")
            _check_sections(current, value, key + ".")


def merge(a: dict, b: dict) -> dict:
    """Nested dicts ``a`` ← ``b`` (``b`` wins; sections merge key by key)."""
    out = dict(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"train.max_steps": 5, "seed": 1}`` → ``{"train": {"max_steps": 5}, "seed": 1}``."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        *parts, last = dotted.split(".")
        node = out
        for p in parts:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def resolve_file(path: str | Path) -> Path:
    """A config file: ``path`` itself, else the packaged preset of that name.

    ``sticky_markov``, ``sticky-markov``, ``sticky_markov.toml``, ``dyntool/presets/sticky_markov.toml``
    and ``sims/sticky_markov.toml`` (the old repository path) all name the packaged file, so the
    docs' commands work from any directory.
    """
    p = Path(path)
    if p.is_file():
        return p
    stem = p.name[:-5] if p.name.endswith(".toml") else p.name
    if p.parent == Path(".") or p.parent.name in ("sims", "presets"):
        packaged = PRESETS / f"{stem.replace('-', '_')}.toml"
        if packaged.is_file():
            return packaged
    names = ", ".join(sorted(f.stem for f in PRESETS.glob("*.toml")))
    raise ConfigError("--config", f"no such file: {p} (packaged presets: {names})")


def read_file(path: str | Path) -> dict[str, Any]:
    p = resolve_file(path)
    try:
        return tomllib.loads(p.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError("--config", f"{p} is not valid TOML ({e})") from None
    except OSError as e:
        raise ConfigError("--config", f"{p} can't be read ({e.strerror or e})") from None


def load(cls: type, path: str | Path | None = None, preset: str | None = None,
         overrides: list[str] | None = None, values: dict[str, Any] | None = None,
         base: dict[str, Any] | None = None) -> Any:
    """Build a ``cls`` config: defaults ← ``base`` (e.g. a run's config.json) ← TOML file ←
    preset ← ``--a.b=c`` overrides ← ``values`` (typed, nested or dotted keys, from named flags)."""
    # old key names become new ones layer by layer, before merging: a new key in a later layer
    # overrides an old one in an earlier layer (a resumed run's config.json, quietly) as it would its own
    tree: dict[str, Any] = rename(cls, dict(base or {}), warn=False)
    presets: dict[str, Any] = {}
    if path is not None:
        file_values = read_file(path)
        presets = file_values.pop("preset", {})
        tree = merge(tree, rename(cls, file_values))
    if preset is not None:
        if preset not in presets:
            where = f" in {resolve_file(path)}" if path is not None else " (no --config file given)"
            raise ConfigError("--preset", f"unknown preset {preset!r}{where} "
                                          f"(available: {', '.join(presets) or 'none'})")
        tree = merge(tree, rename(cls, presets[preset]))
    if overrides:
        parsed = rename(cls, parse_overrides(overrides))
        _check_sections(cls(), parsed)       # before typed flags could replace a bad sub-key unseen
        tree = merge(tree, parsed)
    if values:
        tree = merge(tree, rename(cls, nest(values)))
    return update(cls(), tree)


def key_type(cls: type, dotted: str) -> Any:
    """The annotation of config key ``dotted`` in schema ``cls`` (raises ConfigError if unknown)."""
    node: Any = cls
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        hints = _hints(node)
        if part not in hints:
            raise ConfigError(dotted, "unknown key")
        tp = hints[part]
        if i < len(parts) - 1:
            node = tp
    return tp


def parse_value(cls: type, dotted: str, text: str) -> Any:
    """Parse a command-line string for key ``dotted`` of ``cls`` exactly as the config would."""
    return coerce(dotted, key_type(cls, dotted), text)


def keys(cls: type, prefix: str = "") -> list[str]:
    """Every leaf key of schema ``cls``, dotted."""
    out = []
    for name, tp in _hints(cls).items():
        if dataclasses.is_dataclass(tp):
            out += keys(tp, prefix + name + ".")
        else:
            out.append(prefix + name)
    return out


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)
