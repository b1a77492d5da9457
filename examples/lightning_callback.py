"""PyTorch Lightning + dyntool's Callback: a LightningModule around a tiny HF GPT-2, probe
recorded every 50 optimizer steps.  Env: STEPS, DATA, OUT."""
import os

import lightning as L
import torch
import transformers

from dyntool.data.wikitext import fixed_batch, get_batch, load_wikitext
from dyntool.integrations import LightningRecorder

steps, T = int(os.environ.get("STEPS", 200)), 32
corpus = load_wikitext(os.environ.get("DATA") or None)   # default: ../shared/data/wikitext-2


class LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=corpus.vocab_size, n_positions=T, n_embd=64, n_layer=2, n_head=4,
            attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0))

    def training_step(self, batch, batch_idx):
        loss = self.net(input_ids=batch, labels=batch).loss
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


gen = torch.Generator().manual_seed(0)
batches = [get_batch(corpus.train, 16, T, gen)[0] for _ in range(steps)]
torch.manual_seed(0)
probe, _ = fixed_batch(corpus.valid, 1, T)
rec = LightningRecorder(os.environ.get("OUT", "runs"), probe=probe, every=50,
                        tokens=[[corpus.vocab[i] for i in probe[0]]])
trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1, callbacks=[rec], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(LM(), torch.utils.data.DataLoader(batches, batch_size=None))
print(rec.path)
