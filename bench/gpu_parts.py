"""Which parts of bench/gpu_session.sh a GPU session still owes (issues 34, 46), from the committed results.

    python bench/gpu_parts.py                  # the owed parts in priority order, e.g. "profile timing wind-tunnel ..."
    python bench/gpu_parts.py --check          # every bench/gpu_*.json holds KEYS, hardware, a reason per null
    python bench/gpu_parts.py --plan           # the owed parts packed into calls that fit one session
    python bench/gpu_parts.py --resume-from DIR PREFIX   # the run of a wind-tunnel chain to --resume (or nothing)
    python bench/gpu_parts.py --skeleton OUT [--commit C]  # bench/gpu_<date>.json from a session's $OUT

A session runs the parts whose keys are missing or null in every committed ``bench/gpu_*.json``
(a key measured by any earlier session is not measured again), in the order of ``PARTS`` (issue
46's priority), then ``tests``.  Each session commits one file, ``bench/gpu_<date>.json``, holding
``hardware``, ``commit``, ``commands``, every key below (null where not measured) and ``why_null``:
{key: the reason} for each null; ``--skeleton`` writes it from what the session script left in
$OUT (parts.jsonl, hardware.txt), every key null with the reason the script knows (not reached, cut
by its limit, failed, or ran: read its log), for the session to fill in from the outputs.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
# the parts in the order a session runs them (issue 46), and the keys each part's results fill
PARTS = {
    "profile": ("profile_recorded_step_T2048",),
    "timing": ("fused_vs_sdpa_T2048", "fused_vs_sdpa_T4096", "fused_vs_sdpa_T8192",
               "cheap_every_step_ratio_T2048", "cheap_every_step_ratio_T8192", "every50_ratio",
               "mhsa_vs_nanogpt"),
    "wind-tunnel": ("wind_tunnel", "wind_tunnel_100k_paper", "wind_tunnel_100k_authors"),
    "span": ("span_delta_val_loss_pct", "best_val_ppl_span", "span_arms"),
    "ls-logits": ("ls_max_logit_T512", "ls_max_logit_T1024", "ls_max_logit_T2048"),
    "presets": ("best_val_ppl_ls", "best_val_ppl_qknorm"),
}
KEYS = tuple(k for keys in PARTS.values() for k in keys)
# keys added after the first sessions: a file dated before a key's introduction need not hold it
SINCE = {"profile_recorded_step_T2048": "2026-11-28", "wind_tunnel_100k_paper": "2026-11-28",
         "wind_tunnel_100k_authors": "2026-11-28", "span_arms": "2026-11-28"}
# a part's keys measured before this date are owed again: the fused kernel was rewritten (README, "the
# fused kernel's rewrite"), so its earlier timings are of the first version (issue 46, item 3)
STALE_BEFORE = {"timing": "2026-11-28"}
# a part that continues where the previous call stopped (--resume): it may take whatever a session has left
RESUMABLE = {"wind-tunnel"}
# rough seconds per part on one GPU (the previous sessions' logs), for --plan; tests run last
SECONDS = {"profile": 120, "timing": 420, "wind-tunnel": 540, "span": 450, "ls-logits": 450, "presets": 450,
           "tests": 90}
CALL_S, SESSION_S, START_S = 560, 900, 120      # a call's DEADLINE, a session's device time, a cold start


def results(folder: Path = BENCH) -> dict[str, dict]:
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("gpu_*.json"))}


def _required(d: dict) -> tuple[str, ...]:
    date = str(d.get("date", ""))[:10]
    return tuple(k for k in KEYS if k not in SINCE or (date and date >= SINCE[k]))


def problems(name: str, d: dict) -> list[str]:
    """What a committed session file lacks: hardware, a key, or the reason beside a null."""
    out = [] if isinstance(d.get("hardware"), str) and d["hardware"].strip() else [f"{name}: no hardware"]
    why = d.get("why_null") or {}
    for k in _required(d):
        if k not in d:
            out.append(f"{name}: no key {k}")
        elif d[k] is None and not str(why.get(k, "")).strip():
            out.append(f"{name}: {k} is null without a reason in why_null")
    return out


def owed(files: dict[str, dict]) -> list[str]:
    """Every part with a key that no file holds a value for, in priority order, then ``tests``."""
    def measured(part: str) -> set:
        since = STALE_BEFORE.get(part, "")
        return {k for d in files.values() if str(d.get("date", ""))[:10] >= since for k in PARTS[part]
                if d.get(k) is not None}
    return [p for p, keys in PARTS.items() if not set(keys) <= measured(p)] + ["tests"]


def plan(parts: list[str], call_s: int = CALL_S, session_s: int = SESSION_S,
         start_s: int = START_S) -> list[tuple[list[str], int]]:
    """``parts`` in order, packed into calls (parts, DEADLINE) of at most ``call_s`` seconds within
    one session's ``session_s`` of device time (the machine's start counted once); a part longer than
    a call gets one of its own, cut at its DEADLINE; a resumable part takes what is left (at least 4
    minutes: a call's start and its compile cost about one).  What does not fit waits for the next
    session."""
    calls: list[tuple[list[str], int]] = []
    used, left = 0, session_s - start_s
    for p in parts:
        need = min(SECONDS.get(p, call_s), call_s)
        if calls and used + need <= calls[-1][1] and need <= left:
            calls[-1][0].append(p)
        elif need <= left and left >= 240:      # a new call only with 4 minutes to spare
            calls.append(([p], call_s))
            used = 0
        elif p in RESUMABLE and left >= 240:    # the rest of the session; the next one continues it
            calls.append(([p], left - 30))
            break
        else:
            break
        used += need
        left -= need
    return calls


def resume_from(folder: Path, prefix: str) -> str:
    """The run of the chain ``prefix*`` in ``folder`` whose checkpoint is furthest, if it is short of
    its config's ``steps`` ("" when there is none, or it is done)."""
    best, best_step = None, -1
    for run in sorted(folder.glob(prefix + "*")):
        ck = run / "checkpoint.pt"
        if not ck.is_file():
            continue
        import torch            # only when there is a checkpoint to read: a fresh chain needs no torch
        step = int(torch.load(ck, map_location="cpu", weights_only=True)["step"])
        if step > best_step:
            best, best_step = run, step
    if best is None:
        return ""
    steps = json.loads((best / "config.json").read_text()).get("steps", 0)
    return str(best) if best_step < steps else ""


def skeleton(out: Path, commit: str = "") -> dict:
    """A session file from the session script's $OUT: hardware, commit, the commands, every key null
    with the reason the script can tell (the session then fills in the numbers from the outputs)."""
    rows = [json.loads(line) for line in (out / "parts.jsonl").read_text().splitlines() if line.strip()] \
        if (out / "parts.jsonl").is_file() else []
    hw = (out / "hardware.txt").read_text().strip() if (out / "hardware.txt").is_file() else ""
    by_part: dict[str, list[dict]] = {}
    for r in rows:
        by_part.setdefault(r["part"], []).append(r)
    why = {}
    for part, keys in PARTS.items():
        ran = by_part.get(part, [])
        if not ran:
            reason = "not reached in this session"
        elif any(r.get("rc") in (124, 137) for r in ran):
            reason = "cut by its time limit (rc 124/137): read its log in results.tgz"
        elif any(r.get("rc") not in (0, None) for r in ran):
            reason = f"the part failed (rc {[r.get('rc') for r in ran]}): read its log in results.tgz"
        else:
            reason = "ran: fill in from its output in results.tgz"
        why.update({k: reason for k in keys})
    return {"date": datetime.date.today().isoformat(), "hardware": hw or "unknown: no hardware.txt in $OUT",
            "commit": commit or (rows[0].get("commit", "") if rows else ""),
            "commands": [r["command"] for r in rows], **{k: None for k in KEYS}, "why_null": why}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="check the committed files instead")
    ap.add_argument("--plan", action="store_true", help="the owed parts as calls that fit one session")
    ap.add_argument("--resume-from", nargs=2, metavar=("DIR", "PREFIX"), default=None)
    ap.add_argument("--skeleton", metavar="OUT", default=None, help="a session's $OUT folder")
    ap.add_argument("--commit", default="")
    ap.add_argument("--dir", default=str(BENCH), help="where the gpu_*.json files are")
    a = ap.parse_args(argv)
    if a.resume_from:
        print(resume_from(Path(a.resume_from[0]), a.resume_from[1]))
        return 0
    if a.skeleton:
        print(json.dumps(skeleton(Path(a.skeleton), a.commit), indent=1))
        return 0
    files = results(Path(a.dir))
    if a.check:
        bad = [p for n, d in files.items() for p in problems(n, d)]
        for p in bad:
            print(p, file=sys.stderr)
        return 1 if bad else 0
    if a.plan:
        for i, (parts, deadline) in enumerate(plan(owed(files)), 1):
            wt = f"WT_MIN={max(1, (deadline - 90) // 60)} " if "wind-tunnel" in parts else ""
            print(f"call {i}: {wt}DEADLINE={deadline} bash bench/gpu_session.sh {' '.join(parts)}")
        return 0
    print(" ".join(owed(files)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
