"""A recorded step of the batched single-head engine on random float64 data, for tests of what
hooks compute from a :class:`~dyntool.sims.step_state.StepState`."""
import torch

from dyntool.sims import single_head as engine


def engine_state(R: int = 2, N: int = 31, seed: int = 0, std: float = 0.5):
    """The StepState of step 0 (before any update) of R runs on N random positions."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(R, N, 20, generator=g, dtype=torch.float64)
    y = torch.randint(8, (R, N), generator=g)
    W = engine.init_weights(list(range(R)), dtype=torch.float64, std=std)
    got = {}
    engine.train(x, y, W, torch.zeros(R, 4), 1, on_step=lambda s, st: got.setdefault(s, st), record_steps={0})
    return got[0]
