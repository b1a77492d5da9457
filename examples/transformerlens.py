"""A TransformerLens HookedTransformer (tiny config, no weights) trained on WikiText-2 windows;
dyntool records a probe through hook_q/k/v/z every 50 steps.  Env: STEPS, DATA, OUT."""
import os
import warnings

import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from dyntool.data.wikitext import fixed_batch, get_batch, load_wikitext
from dyntool.integrations import RunRecorder

steps, T = int(os.environ.get("STEPS", 200)), 32
corpus = load_wikitext(os.environ.get("DATA") or None)   # default: ../shared/data/wikitext-2
cfg = HookedTransformerConfig(n_layers=2, d_model=64, n_ctx=T, d_head=16, n_heads=4, d_vocab=corpus.vocab_size,
                              act_fn="gelu", normalization_type="LN", device="cpu", seed=0)
with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)     # TL 3.x points at TransformerBridge
    model = HookedTransformer(cfg)
opt, gen = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0)
probe, _ = fixed_batch(corpus.valid, 1, T)
loss_fn = lambda m, toks: m(toks, return_type="loss")     # noqa: E731
with RunRecorder(model, os.environ.get("OUT", "runs"), max_steps=steps, every=50, probe=probe,
                 loss_fn=loss_fn) as rec:
    for step in range(steps):
        rec.probe_step(step)
        x, _ = get_batch(corpus.train, 16, T, gen)
        loss = model(x, return_type="loss")
        loss.backward()
        opt.step()
        opt.zero_grad()
        rec.log(step, loss=loss.item())
print(rec.path)
