"""What a config value may be, and how one value is read: the annotations :class:`Range` and
:class:`Pattern` (bounds and formats declared on a field), the common aliases (:data:`Seed`,
:data:`PosInt`, :data:`Device`, ...), and :func:`coerce`, which turns a TOML value, a command-line
string or a typed flag into the annotated type and checks it.  :mod:`dyntool.config` (loading,
presets, overrides, renamed keys) builds on it."""
from __future__ import annotations

import dataclasses
import math
import re
import types
import typing
from typing import Annotated, Any

from .errors import ConfigError


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


@dataclasses.dataclass(frozen=True)
class Range:
    """Bounds of a numeric leaf: ``lo <= x <= hi`` (``None`` = unbounded); ``lo_open``: ``lo < x``."""
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False

    def check(self, key: str, x: Any) -> None:
        if (self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo)) or \
                (self.hi is not None and x > self.hi):
            lo = "" if self.lo is None else f"{_num(self.lo)} {'<' if self.lo_open else '<='} "
            hi = "" if self.hi is None else f" <= {_num(self.hi)}"
            raise ConfigError(key, f"must satisfy {lo}{key.rsplit('.', 1)[-1]}{hi}, got {x!r}")


@dataclasses.dataclass(frozen=True)
class Pattern:
    """A string leaf that must fully match ``regex`` (``what`` says it in words)."""
    regex: str
    what: str

    def check(self, key: str, x: Any) -> None:
        if not re.fullmatch(self.regex, x):
            raise ConfigError(key, f"must be {self.what}, got {x!r}")


SEED_MAX = 2**32 - 1          # np.random.seed's range (torch accepts more)
Seed = Annotated[int, Range(0, SEED_MAX)]
PosInt = Annotated[int, Range(1)]
NonNegInt = Annotated[int, Range(0)]
PosFloat = Annotated[float, Range(0, lo_open=True)]
NonNegFloat = Annotated[float, Range(0)]
Device = Annotated[str, Pattern(r"auto|cpu|mps|cuda(:\d+)?", "auto, cpu, cuda, cuda:N or mps")]


def leaf_type(tp: Any) -> tuple[Any, bool, tuple]:
    """Return (base type, optional?, constraints) for a leaf annotation."""
    checks: tuple = ()
    if typing.get_origin(tp) is Annotated:
        tp, *meta = typing.get_args(tp)
        checks = tuple(m for m in meta if hasattr(m, "check"))
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            base, _, inner = leaf_type(args[0])
            return base, True, checks + inner
    return tp, False, checks


def coerce(key: str, tp: Any, value: Any) -> Any:
    """Coerce ``value`` (from TOML, a CLI string or a typed flag) to annotation ``tp`` and check it."""
    base, optional, checks = leaf_type(tp)
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null") and optional):
        if optional:
            return None
        raise ConfigError(key, "may not be empty")
    out = _coerce_base(key, base, value)
    for c in checks:
        c.check(key, out)
    return out


FLOAT_MAX = 3.4028234663852886e38
INT_MAX = 2**62               # larger integers overflow numpy/torch int64 arithmetic


def _int_size(key: str, x: int) -> int:
    if abs(x) > INT_MAX:
        raise ConfigError(key, f"must be at most 2**62 in size, got {x}")
    return x


def _coerce_int(key: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(key, f"expected an integer, got {value!r}")
    if isinstance(value, int):
        return value
    try:
        return int(value)                 # exact for long integer strings
    except (TypeError, ValueError):
        pass
    try:
        f = float(value)                  # "1e3" is an integer too
    except (TypeError, ValueError):
        raise ConfigError(key, f"expected an integer, got {value!r}") from None
    if not math.isfinite(f) or not f.is_integer():
        raise ConfigError(key, f"expected an integer, got {value!r}")
    return int(f)


def _coerce_base(key: str, base: Any, value: Any) -> Any:
    if value is None:                   # optional leaves were handled by the caller
        raise ConfigError(key, "may not be empty")
    origin = typing.get_origin(base)
    if origin is list:
        (item_tp,) = typing.get_args(base) or (str,)
        if isinstance(value, str):
            value = [v for v in value.strip("[]").split(",") if v.strip()]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"expected a list, got {value!r}")
        return [coerce(key, item_tp, v.strip() if isinstance(v, str) else v) for v in value]
    if base is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("1", "true", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(key, f"expected true/false, got {value!r}")
    if base is int:
        return _int_size(key, _coerce_int(key, value))
    if base is float:
        if isinstance(value, bool):
            raise ConfigError(key, f"expected a number, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(key, f"expected a number, got {value!r}") from None
        if not math.isfinite(f):              # "1e400" parses as inf; nan/inf are never a setting
            raise ConfigError(key, f"must be a finite number, got {value!r}")
        if abs(f) > FLOAT_MAX:                # torch keeps hyperparameters as float32 tensors
            raise ConfigError(key, f"must be a finite number of float32 size (|x| <= 3.4e38), got {value!r}")
        return f
    if base is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(key, f"expected a string, got {value!r}")
        return str(value)
    raise ConfigError(key, f"unsupported type {base!r}")
