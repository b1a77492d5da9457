"""The names and order of the fused ops' per-head sums, importable without Triton (the flight
recorder reads them on a core install; :mod:`.stats` and the kernels use the same tuples)."""
FORWARD_SUMS = ("ent", "score_max", "logit_max", "sink")
BACKWARD_SUMS = ("eb", "u2", "var", "ds2", "colmax", "colent", "dv2")
