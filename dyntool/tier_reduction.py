"""The cheap tier's statistics computed from a full-tier capture: the independent computation the
cheap tier (``dyntool.flight``, eager or fused) must equal in the tests, and a way to put both tiers
of one step side by side.  Formulas: ``dyntool/cheap_stats.py``."""
from __future__ import annotations

import torch

from .record import names


def full_tier_reduction(qs: dict[str, torch.Tensor], sites: list[dict] | None = None) -> dict[str, torch.Tensor]:
    """The cheap tier's statistics from a full-tier capture (``Capture.compute()``): the
    independent computation the cheap tier must equal (tests), and a way to put both tiers of one
    step side by side.  ``sites``: ``Capture.attrs["sites"]`` when sites were padded to one size
    (an encoder–decoder); each layer is cut back to its own (T, Tk).  (L, nh) each."""
    if sites is not None and len({(s["T"], s["Tk"]) for s in sites}) > 1:
        per = []
        for s in sites:
            cut = {}
            for n, x in qs.items():
                x = x[s["index"]: s["index"] + 1]
                dims = names.DIMS.get(n, ())[3:]
                for ax, d in enumerate(dims):
                    if d in ("query", "key"):
                        x = x.narrow(3 + ax, 0, s["T"] if d == "query" else s["Tk"])
                cut[n] = x
            per.append(full_tier_reduction(cut))
        return {n: torch.cat([p[n] for p in per]) for n in per[0]}
    a, b, eb = qs["attn"], qs["compat"], qs["expected_compat"]             # (L, nh, S, T, Tk)
    S, T = a.shape[2], a.shape[3]
    col = qs["column_usage"]                                               # (L, nh, S, Tk)
    p = col / col.sum(-1, keepdim=True)
    out = {
        "score_max": torch.nan_to_num(qs["scores"], nan=float("-inf")).amax(dim=(2, 3, 4)),
        "logit_max": qs["logit_max"],
        "attn_entropy": qs["attn_entropy"].mean(dim=(2, 3)),
        "expected_compat": eb.mean(dim=(2, 3)),
        "compat_var": (a * (b - eb[..., None]) ** 2).sum(-1).mean(dim=(2, 3)),
        "score_grad_norm": (qs["score_grad"].square().sum(dim=(2, 3, 4)) / S).sqrt(),
        "upstream_norm": (qs["upstream"].square().sum(dim=(2, 3, 4)) / S).sqrt(),
        "value_grad_norm": (qs["value_grad"].square().sum(dim=(2, 3, 4)) / S).sqrt(),
        "column_max": col.amax(-1).mean(-1) / T,
        "column_entropy": torch.special.entr(torch.nan_to_num(p)).sum(-1).mean(-1),
    }
    if "sink_mass" in qs:
        out["sink_mass"] = qs["sink_mass"].mean(dim=(2, 3))
    return out
