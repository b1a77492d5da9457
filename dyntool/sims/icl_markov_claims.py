"""The fourth round's claims of an ICL-MC study (issue 48), per prior over seeds, and their lines of
the printed table.  Each claim is named for what it compares:

* ``bigram_mid``: the bigram stage's start as the KL(bigram) drop's midpoint, beside the argmin
  rule's start (``argmin_minus_mid``: how far into the transition the argmin rule fires);
* ``layer_order``: which layer moves first, (a) on the *same* quantity in both layers (the
  induction-specific measure lift(induction)/lift(neither), the induction score, the previous-token
  score) and (b) *across* quantities, L1's induction-specific measure (or L1's induction score, the
  comparison the first docs made) against L0's previous-token score;
* ``same_token_avoidance``: the second layer's lowest same-token lift and its end value (below 1: it
  avoids keys equal to the current state, which raises the induction score without induction);
* ``lead_over_prev_token``: L0's ‖∂L/∂S‖ against L0's previous-token score, best lag of their
  changes' cross-correlation with a circular-shift null; ``lead_circular``: the pre-registered
  lead (against −ΔKL(bigram)) with the same null; ``peak_vs_mid``: the ‖∂L/∂S‖ peak's steps
  before the KL midpoint (a description, no p);
* ``transfer``: per other held-out set, how many seeds reach the bigram stage on it and when.
"""
from __future__ import annotations

from ..stats import mean_std


def ms(values) -> dict:
    """Mean ± sample sd of the values that are not None, with how many there were of how many."""
    values = list(values)
    vals = [v for v in values if v is not None]
    m, s = mean_std(vals) if vals else (float("nan"), float("nan"))
    return {"mean": m, "std": s, "n": len(vals), "of": len(values)}


def _t10(run: dict, head: str, q: str):
    return ((run["heads"].get(head) or {}).get(q) or {}).get("t10")


def _order(runs: dict, seeds: list[int], q1: tuple[str, str], q0: tuple[str, str]) -> dict:
    """In how many seeds the t10 of q1 = (head, quantity) comes before that of q0, and by how much."""
    gaps = []
    for s in seeds:
        a, b = _t10(runs[s], *q1), _t10(runs[s], *q0)
        gaps.append(None if None in (a, b) else b - a)
    return {"first": sum(g is not None and g > 0 for g in gaps), "of": sum(g is not None for g in gaps),
            "steps_ahead": ms(gaps), "per_seed": gaps}


def claims(runs: dict[int, dict], n_layer: int) -> dict:
    seeds = sorted(runs)
    out: dict = {}
    mids = [runs[s].get("bigram_mid") for s in seeds]
    out["bigram_mid"] = {**ms(mids), "per_seed": mids,
                         "argmin_minus_mid": ms([None if None in (runs[s]["bigram_start"], m) else
                                                  runs[s]["bigram_start"] - m for s, m in zip(seeds, mids)])}
    if n_layer >= 2:
        same = {q: _order(runs, seeds, ("L1H0", q), ("L0H0", q))
                for q in ("induction_specific", "induction", "prev_token")}
        across = {"L1 induction_specific vs L0 prev_token": _order(runs, seeds, ("L1H0", "induction_specific"),
                                                                  ("L0H0", "prev_token")),
                  "L1 induction score vs L0 prev_token": _order(runs, seeds, ("L1H0", "induction"),
                                                               ("L0H0", "prev_token"))}
        out["layer_order"] = {"same_quantity": same, "across_quantities": across}
        lifts = [(runs[s]["heads"].get("L1H0") or {}).get("lift_same") for s in seeds]
        out["same_token_avoidance"] = {"L1_min": ms([l and l["min"] for l in lifts]),
                                       "L1_end": ms([l and l["end"] for l in lifts])}
        out["lifts_end"] = {hd: {kt: ms([((runs[s]["heads"].get(hd) or {}).get(f"lift_{kt}") or {}).get("end")
                                          for s in seeds]) for kt in ("same", "induction", "both", "neither")}
                            for hd in ("L0H0", "L1H0")}
    for key in ("lead_over_prev_token", "lead_circular"):
        rows = [runs[s].get(key) or {} for s in seeds]
        out[key] = {"lag_steps": ms([r.get("lag_steps") for r in rows]),
                    "per_seed": [(r.get("lag_steps"), r.get("p")) for r in rows],
                    "p_below_0.05": sum((r.get("p") or 1) < 0.05 for r in rows)}
    pv = [(runs[s].get("peak_vs_mid") or {}).get("steps_before_mid") for s in seeds]
    out["peak_vs_mid"] = {**ms(pv), "per_seed": pv}
    tr: dict = {}
    for s in seeds:
        for prior, t in (runs[s].get("transfer") or {}).items():
            tr.setdefault(prior, {})[str(s)] = t
    out["transfer"] = {p: {"bigram_stage": sum(t["bigram_start"] is not None for t in v.values()), "of": len(v),
                           "bigram_start": ms([t["bigram_start"] for t in v.values()]), "per_seed": v}
                       for p, v in tr.items()}
    return out


def fmt(d: dict, digits: int = 0, none: str = "-") -> str:
    """"mean ± sd" of an :func:`ms` dict, "(n/of)" when some were None; ``none`` when all were."""
    if not d or d.get("n", 0) == 0:
        return none
    s = f"{d['mean']:.{digits}f} ± {d['std']:.{digits}f}"
    return s + (f" ({d['n']}/{d['of']})" if d["n"] != d["of"] else "")


def at_step(d: dict) -> str:
    """A stage start: "starts at step 255 ± 7", or "never reached" (issue 50: not "at step never")."""
    return f"starts at step {fmt(d)}" if d and d.get("n", 0) else "never reached"



def table_lines(c: dict) -> list[str]:
    lines = [f"  bigram stage as the KL drop's midpoint: {at_step(c['bigram_mid'])}; the argmin rule fires "
             f"{fmt(c['bigram_mid']['argmin_minus_mid'])} steps after it"]
    for q, v in (c.get("layer_order") or {}).get("same_quantity", {}).items():
        lines.append(f"  same quantity, L1 before L0 ({q}): {v['first']}/{v['of']} seeds, by {fmt(v['steps_ahead'])} steps")
    for q, v in (c.get("layer_order") or {}).get("across_quantities", {}).items():
        lines.append(f"  across quantities, {q}: first in {v['first']}/{v['of']} seeds, by {fmt(v['steps_ahead'])} steps")
    if "same_token_avoidance" in c:
        a = c["same_token_avoidance"]
        lines.append(f"  L1 same-token lift: min {fmt(a['L1_min'], 2)}, end {fmt(a['L1_end'], 2)} (1: no preference)")
    for key, what in (("lead_over_prev_token", "L0 ‖∂L/∂S‖ over L0 prev-token score"),
                      ("lead_circular", "L0 ‖∂L/∂S‖ over the bigram transition")):
        v = c[key]
        lines.append(f"  lead of {what}: {fmt(v['lag_steps'])} steps; p < 0.05 vs circular shifts in "
                     f"{v['p_below_0.05']}/{len(v['per_seed'])} seeds")
    lines.append(f"  L0 ‖∂L/∂S‖ peak before the KL midpoint by {fmt(c['peak_vs_mid'])} steps")
    for p, v in c.get("transfer", {}).items():
        lines.append(f"  held-out {p} chains: bigram stage in {v['bigram_stage']}/{v['of']} seeds, {at_step(v['bigram_start'])}")
    return lines
