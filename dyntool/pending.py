"""A cheap-tier metrics row on its way from the device to the host, never waited for before the
step that made it has launched its optimizer (``FlightRecorder.metrics_later``)."""
from __future__ import annotations

import torch

from .record import metric_names as mn


class PendingMetrics:
    """A cheap-tier row on its way to the host.  On CUDA the (n, L, nh) values are copied into a
    pinned buffer with ``non_blocking`` and an event is recorded; :meth:`get` waits on that event
    only (the copy, queued after the backward), never on work launched after it."""

    def __init__(self, names: list, vals: torch.Tensor, pinned: dict):
        self.names = names
        if vals.is_cuda:
            ring = pinned.setdefault(tuple(vals.shape), [])
            if len(ring) < 2:                # two buffers: a row may wait while the next is made
                ring.append(torch.empty(vals.shape, dtype=vals.dtype, device="cpu", pin_memory=True))
            host = ring.pop(0)
            ring.append(host)
            host.copy_(vals, non_blocking=True)
            self._host, self._event = host, torch.cuda.Event()
            self._event.record()
        else:
            self._host, self._event = vals, None

    def get(self) -> dict[str, float]:
        if self._event is not None:
            self._event.synchronize()
        vals = self._host.tolist()
        return {mn.head(n, l, h): v for n, layers in zip(self.names, vals)
                for l, heads in enumerate(layers) for h, v in enumerate(heads)}
