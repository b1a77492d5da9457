"""The end-of-run evaluation (``train.final_eval``): exact, bounded, or none.

``full`` reads the whole validation and test splits (463k tokens of WikiText-2; minutes on a
2-core CPU).  ``auto`` (the default) does that too, unless the run trained on fewer tokens than
those splits hold: then each split is read only up to half the tokens the run trained on (at
least one batch), so a 20-step try ends in seconds instead of spending 7 minutes evaluating a
model that saw 20k tokens.  The numbers it gives are then estimates, and the run says so:
``meta.final.final_eval`` (``full`` or ``bounded``) and ``final_eval_tokens`` (targets read per
split), the announcement line and the console's last line.  ``off`` skips it.

Before it starts, one line says what it reads and about how long it will take (from the
periodic validation's rate when there was one, else from the training rate: a forward is about a
third of a training step).
"""
from __future__ import annotations

import math
import sys
import time

MODES = ("auto", "full", "off")
# the old boolean setting (train.final_eval = true/false) still loads: true was the exact evaluation
_OLD = {"true": "full", "1": "full", "yes": "full", "on": "full",
        "false": "off", "0": "off", "no": "off"}


def normalize(value: str) -> str:
    """``train.final_eval`` as one of :data:`MODES` (old boolean spellings mapped)."""
    v = str(value).strip().lower()
    return _OLD.get(v, v)


def batch_size(cfg) -> int:
    """Sequences per final-eval batch: at least ``eval_batch_size``, grown to 8,192 tokens
    (fewer, larger matmuls: 0.75-0.85× the time of 2,048-token batches on 2 CPU cores; the
    logits are B·T·V floats, 1.1 GB at V = 33k, which is why it stops there)."""
    d = cfg.data
    return max(d.eval_batch_size, 8192 // d.block_size)


def trained_tokens(trainer) -> int:
    """Training tokens this run read (the steps it took × tokens per step, all ranks)."""
    d, o = trainer.cfg.data, trainer.cfg.optim
    return trainer.step * d.batch_size * d.block_size * o.accum * trainer.dist.world


def plan(trainer) -> tuple[str, dict[str, int], int | None, int]:
    """``(mode, targets per split, max_batches or None, sequences per batch)``: what the final
    evaluation reads."""
    cfg = trainer.cfg
    T = cfg.data.block_size
    sizes = {s: len(trainer.corpus.split(s)) - 1 for s in ("valid", "test")}
    mode, bs = normalize(cfg.train.final_eval), batch_size(cfg)
    seen = trained_tokens(trainer)
    if mode == "full" or seen >= sum(sizes.values()):
        return "full", sizes, None, bs
    seqs = max(1, -(-(seen // 2) // T))                 # half the trained tokens per split, whole windows
    n_batches = -(-seqs // bs)
    bs = -(-seqs // n_batches)                            # batches of equal size: no overshoot
    tokens = {s: min(n, n_batches * bs * T) for s, n in sizes.items()}
    if tokens == sizes:
        return "full", sizes, None, batch_size(cfg)
    return "bounded", tokens, n_batches, bs


def estimate_seconds(trainer, tokens: int) -> float | None:
    """About how long reading ``tokens`` takes: the periodic validation's rate, else a third of
    a training step's per-token time."""
    if trainer.eval_seconds > 0 and trainer.eval_tokens > 0:
        return tokens * trainer.eval_seconds / trainer.eval_tokens
    if trainer.train_seconds > 0 and trainer.step > 0:
        return tokens * trainer.train_seconds / trainer_tokens_run(trainer) / 3
    return None


def trainer_tokens_run(trainer) -> int:
    """Training tokens of the steps this process timed (a resumed run timed only its own)."""
    d, o = trainer.cfg.data, trainer.cfg.optim
    return max(1, trainer.steps_run * d.batch_size * d.block_size * o.accum * trainer.dist.world)


def _seconds(s: float | None) -> str:
    if s is None:
        return "?"
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min"


def run(trainer) -> dict:
    """Validation and test loss/perplexity at the end, as :func:`plan` says, announced on stderr
    with a progress bar (a log line per ~30 s when stderr is not a terminal)."""
    mode, tokens, max_batches, bs = plan(trainer)
    if not trainer.quiet:
        total = sum(tokens.values())
        if mode == "full":
            how = "the whole splits (--train.final_eval=off skips it)"
        else:
            how = (f"bounded: the run trained on {trained_tokens(trainer):,} tokens, fewer than the splits' "
                   f"{sum(len(trainer.corpus.split(s)) - 1 for s in tokens):,}; "
                   "--train.final_eval=full reads them all, --train.final_eval=off skips it")
        print(f"final evaluation: valid ({tokens['valid']:,} tokens) + test ({tokens['test']:,} tokens), "
              f"batch {bs}, about {_seconds(estimate_seconds(trainer, total))}; {how}",
              file=sys.stderr, flush=True)
    out, t0 = {}, time.perf_counter()
    read = {}
    for split in ("valid", "test"):
        loss = trainer.evaluate(split, max_batches=max_batches, batch_size=bs,
                                bar=not trainer.quiet)
        read[split] = trainer.last_eval_tokens
        out[f"{split}_loss"], out[f"{split}_ppl"] = loss, math.exp(min(loss, 700.0))
    out["final_eval"] = mode
    out["final_eval_tokens"] = read
    out["final_eval_seconds"] = time.perf_counter() - t0
    return out
