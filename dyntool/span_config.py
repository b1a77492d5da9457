"""The span-recon backward's settings (:class:`SpanConfig`), apart from :mod:`dyntool.span`
so that a config can be checked without importing torch."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

CANDIDATES = ("c1_orthogonal", "c1_oblique", "c1c_first_order", "c2_constant_mode")


@dataclass(frozen=True)
class SpanConfig:
    candidate: str = "c1_orthogonal"
    alpha_q: float = 1.0      # parallel-span scale on dQ
    beta_q: float = 1.0       # violation scale on dQ
    alpha_k: float = 1.0
    beta_k: float = 1.0
    alpha0: float = 0.0       # C2 row constant mode (0 = standard)
    alpha0_col: float = 0.0   # C2 column constant mode (0 = standard)
    apply_q: bool = True
    apply_k: bool = True
    eps: float = 1e-6         # relative guard for the oblique denominator and Gram–Schmidt
    impl: str = "auto"        # auto | eager | hook: which backward path (see span_attention)

    def __post_init__(self):
        if self.candidate not in CANDIDATES:
            raise ValueError(f"SpanConfig.candidate: {self.candidate!r} is not one of "
                             f"{', '.join(CANDIDATES)}")
        if self.impl not in ("auto", "eager", "hook"):
            raise ValueError(f"SpanConfig.impl: auto, eager or hook, got {self.impl!r}")
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("apply_q", "apply_k"):
                if not isinstance(v, bool):
                    raise ValueError(f"SpanConfig.{f.name}: expected a bool, got {v!r}")
            elif f.name not in ("candidate", "impl"):
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                    raise ValueError(f"SpanConfig.{f.name}: expected a finite number, got {v!r}")
        for name in ("alpha_q", "beta_q", "alpha_k", "beta_k"):
            if getattr(self, name) < 0:  # a sign flip is an ascent step; almost surely a typo
                raise ValueError(f"SpanConfig.{name}: expected >= 0, got {getattr(self, name)}")
        if not 0 < self.eps < 1:
            raise ValueError(f"SpanConfig.eps: expected 0 < eps < 1, got {self.eps}")

    @property
    def bidirectional(self) -> bool:
        return self.apply_q and self.apply_k

    @property
    def is_identity(self) -> bool:
        """True when the backward is exactly the standard one."""
        if self.candidate == "c2_constant_mode":
            return not (self.apply_q and self.alpha0) and not (self.apply_k and self.alpha0_col)
        return ((not self.apply_q or self.alpha_q == self.beta_q == 1)
                and (not self.apply_k or self.alpha_k == self.beta_k == 1))
