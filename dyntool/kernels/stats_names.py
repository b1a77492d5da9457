"""The names and order of the fused ops' statistics, importable without Triton (the flight recorder
reads them on a core install).  Each slot is named once, here: the kernels store to
``SLOT_INDEX[name]``, :mod:`.stats` reduces by name, nothing counts positions by hand.

- ``FORWARD_SUMS``: the forward program's partials and the forward op's (H, 4) per-head sums;
- ``DQ_SLOTS``: one dQ program's partials (with the atomic-dQ policy the first program writes Σ D
  and Σ ‖dO‖² and zeros for the score sums, which the dK/dV programs then carry);
- ``DKV_SLOTS``: one dK/dV program's partials, per query head (``c_log_c``, ``c_sum``: the column
  usages' Σ c log c and Σ c, from which :mod:`.stats` forms the column entropy);
- ``BACKWARD_SUMS``: the backward op's (H, 7) per-head sums (the token's gradient), in this order.
"""
FORWARD_SUMS = ("ent", "score_max", "logit_max", "sink")
DQ_SLOTS = ("eb", "u2", "var", "ds2", "dsink")
DKV_SLOTS = ("colmax", "c_log_c", "c_sum", "dv2", "var", "ds2")
BACKWARD_SUMS = ("eb", "u2", "var", "ds2", "colmax", "colent", "dv2")
