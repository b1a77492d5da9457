"""Typed, namespaced configuration (minGPT-style), loadable from TOML with presets.

A config is a tree of dataclasses.  Leaves are ``int, float, bool, str``, ``list`` of
those, or ``Optional`` of those.  Values come, in increasing priority, from the dataclass
defaults, a TOML file (top-level tables = sections), a ``[preset.NAME]`` table in that file,
and ``--section.key=value`` command-line overrides.  Unknown keys and values of the wrong
type raise :class:`ConfigError` naming the full dotted key.
"""
from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from .errors import ConfigError


def _leaf_type(tp: Any) -> tuple[Any, bool]:
    """Return (base type, optional?) for a leaf annotation."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0], True
    return tp, False


def _coerce(key: str, tp: Any, value: Any) -> Any:
    """Coerce ``value`` (from TOML or a CLI string) to annotation ``tp``."""
    base, optional = _leaf_type(tp)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(key, "may not be empty")
    origin = typing.get_origin(base)
    if origin is list:
        (item_tp,) = typing.get_args(base) or (str,)
        if isinstance(value, str):
            value = [v for v in value.strip("[]").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        return [_coerce(key, item_tp, v.strip() if isinstance(v, str) else v) for v in value]
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(key, f"expected true/false, got {value!r}")
    if base is int:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected an integer, got {value!r}") from None
        if not f.is_integer():
            raise ConfigError(key, f"expected an integer, got {value!r}")
        return int(f)
    if base is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected a number, got {value!r}") from None
    if base is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return str(value)
    raise ConfigError(key, f"unsupported type {base!r}")


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def update(cfg: Any, values: dict[str, Any], prefix: str = "") -> Any:
    """Return a copy of dataclass ``cfg`` with nested ``values`` applied (validated)."""
    hints = _hints(type(cfg))
    names = {f.name for f in dataclasses.fields(cfg)}
    changes = {}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if name not in names:
            raise ConfigError(key, f"unknown key (known: {', '.join(sorted(names))})")
        current = getattr(cfg, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(key, "is a section; set its keys as " + key + ".KEY=VALUE")
            changes[name] = update(current, value, prefix=key + ".")
        else:
            changes[name] = _coerce(key, hints[name], value)
    new = dataclasses.replace(cfg, **changes)
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


def _merge(a: dict, b: dict) -> dict:
    out = dict(a)
    for k, v in b.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load(cls: type, path: str | Path | None = None, preset: str | None = None,
         overrides: list[str] | None = None) -> Any:
    """Build a ``cls`` config from defaults ← TOML file ← preset ← ``--a.b=c`` overrides."""
    values: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError("--config", f"no such file: {p}")
        try:
            values = tomllib.loads(p.read_text())
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
            raise ConfigError("--config", f"{p} is not valid TOML ({e})") from None
    presets = values.pop("preset", {})
    if preset is not None:
        if preset not in presets:
            raise ConfigError("--preset", f"unknown preset {preset!r} (available: {', '.join(presets) or 'none'})")
        values = _merge(values, presets[preset])
    if overrides:
        values = _merge(values, parse_overrides(overrides))
    return update(cls(), values)


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def to_json(cfg: Any) -> str:
    return json.dumps(to_dict(cfg), indent=2, sort_keys=False)
