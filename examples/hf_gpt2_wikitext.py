"""Record a tiny Hugging Face GPT-2 training on WikiText-2, then: dyntool app runs
(the README's "Record your own model" example; STEPS/DATA/OUT env vars shrink it for CI)."""
import os, torch, transformers
from dyntool.data.wikitext import load_wikitext, get_batch, fixed_batch
from dyntool.integrations import RunRecorder

steps, T = int(os.environ.get("STEPS", 300)), 64
corpus = load_wikitext(os.environ.get("DATA") or None)   # default: ../shared/data/wikitext-2
torch.manual_seed(0)
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=corpus.vocab_size, n_positions=T,
    n_embd=64, n_layer=2, n_head=4, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0,
    bos_token_id=None, eos_token_id=None))   # GPT-2's 50256 is outside this vocabulary
opt, gen = torch.optim.AdamW(model.parameters(), lr=1e-3), torch.Generator().manual_seed(0)
probe, _ = fixed_batch(corpus.valid, 1, T)                 # the same sequence at every recorded step
with RunRecorder(model, os.environ.get("OUT", "runs"), max_steps=steps, every=50,
                 probe={"input_ids": probe, "labels": probe}, tokens=[[corpus.vocab[i] for i in probe[0]]]) as rec:
    for step in range(steps):
        rec.probe_step(step)                               # α, B, advantages, U ... on recorded steps
        x, _ = get_batch(corpus.train, 16, T, gen)
        loss = model(input_ids=x, labels=x).loss
        loss.backward(); opt.step(); opt.zero_grad()
        rec.log(step, loss=loss.item())
print(rec.path)
