"""Which phase a wind-tunnel run is in, and Paper I's geometry numbers only where the phase matches.

Paper I (arXiv 2512.22471) reports its geometry (residual PC1 share 84–90 %, key mean |cos|
0.09–0.12 against 0.40–0.45 at init, attention entropy 85–90 % below uniform) for a 6×6×192 model
after 100k+ steps, a model that has learned the content lookup at the query.  A run that has only
learned the elimination half (query accuracy at chance) is in another phase, and its numbers say
nothing for or against the paper's: so the JSON and the figures carry Paper I's values only beside
a step whose held-out query accuracy is at least ``LOOKUP_ACCURACY`` (the query's answer is
determined by the context, so a model that has the lookup is near 1; chance is 1/V).  With the
authors' pointer head the untrained model may already answer most queries (docs/results.md): the
rule reads the accuracy, not how it was reached.
"""
from __future__ import annotations

LOOKUP_ACCURACY = 0.9
# key cosine: Paper I's init value is matched by dyntool's key_orth/single set (≈ 0.43 at init), not by
# ctx/vocab (≈ 0.15, the random level): docs/wind_tunnel_differences.md, "Key orthogonality at step 0"
PAPER_I = {"resid_pc1_share": "84–90 %", "key_mean_abs_cos": "0.09–0.12 (0.40–0.45 at init; compare key_orth/single)",
           "attn_entropy_reduction": "85–90 % below uniform", "model": "6×6×192, 100k+ steps, lookup learned"}


def phase(acc_query: float | None) -> str:
    if acc_query is None or acc_query != acc_query:
        return "unknown"
    return "lookup learned" if acc_query >= LOOKUP_ACCURACY else "before the lookup"


def paper_reference(acc_query: float | None, step: int) -> dict:
    """What a run's summary says about Paper I at ``step``: its values when the phase matches, else
    why they are left out."""
    ph = phase(acc_query)
    if ph == "lookup learned":
        return {"phase": ph, "step": step, "query_accuracy": acc_query, "paper_i": PAPER_I}
    return {"phase": ph, "step": step, "query_accuracy": acc_query, "paper_i": None,
            "note": f"Paper I's values are for a model that has learned the lookup; at step {step} the query "
                    f"accuracy is {acc_query if acc_query is None else round(acc_query, 3)} "
                    f"(< {LOOKUP_ACCURACY}), so they are not shown beside this run"}
