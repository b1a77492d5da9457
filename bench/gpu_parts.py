"""Which parts of bench/gpu_session.sh a GPU session still owes (issue 34), from the committed results.

    python bench/gpu_parts.py            # prints e.g. "tests presets span ls-logits wind-tunnel"
    python bench/gpu_parts.py --check    # every bench/gpu_*.json holds KEYS, hardware, a reason per null

A session runs ``tests``, then the parts whose keys are missing or null in every committed
``bench/gpu_*.json`` (a key measured by any earlier session is not measured again).  Each session
commits one file, ``bench/gpu_<date>.json``, holding ``hardware``, every key below (null where not
measured) and ``why_null``: {key: the reason} for each null.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# the parts in the order a session runs them, and the keys each part's results fill
PARTS = {
    "timing": ("fused_vs_sdpa_T2048", "fused_vs_sdpa_T4096", "fused_vs_sdpa_T8192",
               "cheap_every_step_ratio_T2048", "cheap_every_step_ratio_T8192", "every50_ratio",
               "mhsa_vs_nanogpt"),
    "presets": ("best_val_ppl_ls", "best_val_ppl_qknorm"),
    "span": ("span_delta_val_loss_pct", "best_val_ppl_span"),
    "ls-logits": ("ls_max_logit_T512", "ls_max_logit_T1024", "ls_max_logit_T2048"),
    "wind-tunnel": ("wind_tunnel",),
}
KEYS = tuple(k for keys in PARTS.values() for k in keys)


def results(folder: Path = BENCH) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("gpu_*.json"))}


def problems(name: str, d: dict) -> list[str]:
    """What a committed session file lacks: hardware, a key, or the reason beside a null."""
    out = [] if isinstance(d.get("hardware"), str) and d["hardware"].strip() else [f"{name}: no hardware"]
    why = d.get("why_null") or {}
    for k in KEYS:
        if k not in d:
            out.append(f"{name}: no key {k}")
        elif d[k] is None and not str(why.get(k, "")).strip():
            out.append(f"{name}: {k} is null without a reason in why_null")
    return out


def owed(files: dict[str, dict]) -> list[str]:
    """``tests``, then every part with a key that no file holds a value for."""
    measured = {k for d in files.values() for k in KEYS if d.get(k) is not None}
    return ["tests"] + [p for p, keys in PARTS.items() if not set(keys) <= measured]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="check the committed files instead")
    ap.add_argument("--dir", default=str(BENCH), help="where the gpu_*.json files are")
    a = ap.parse_args(argv)
    files = results(Path(a.dir))
    if a.check:
        bad = [p for n, d in files.items() for p in problems(n, d)]
        for p in bad:
            print(p, file=sys.stderr)
        return 1 if bad else 0
    print(" ".join(owed(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
