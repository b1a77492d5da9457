"""Hugging Face Trainer + dyntool's TrainerCallback: a tiny Llama-style decoder (grouped-query
attention) on WikiText-2, probe recorded every 50 optimizer steps.  Env: STEPS, DATA, OUT."""
import os

import torch
import transformers

from dyntool.data.wikitext import fixed_batch, load_wikitext
from dyntool.integrations import HFRecorderCallback

steps, T = int(os.environ.get("STEPS", 200)), 32
corpus = load_wikitext(os.environ.get("DATA") or None)   # default: ../shared/data/wikitext-2
ids = torch.as_tensor(corpus.train[: (len(corpus.train) // T) * T].astype("int64")).view(-1, T)


class Windows(torch.utils.data.Dataset):
    def __len__(self):
        return len(ids)

    def __getitem__(self, i):
        return {"input_ids": ids[i], "labels": ids[i]}


cfg = transformers.LlamaConfig(vocab_size=corpus.vocab_size, hidden_size=64, intermediate_size=128,
                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               max_position_embeddings=T, bos_token_id=0, eos_token_id=1, pad_token_id=2)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg)
probe, _ = fixed_batch(corpus.valid, 1, T)
rec = HFRecorderCallback(os.environ.get("OUT", "runs"), probe={"input_ids": probe, "labels": probe}, every=50,
                         tokens=[[corpus.vocab[i] for i in probe[0]]])
args = transformers.TrainingArguments(output_dir=os.path.join(os.environ.get("OUT", "runs"), ".hf_trainer"),
                                      max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-3,
                                      logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                                      disable_tqdm=True)
transformers.Trainer(model=model, args=args, train_dataset=Windows(), callbacks=[rec]).train()
# under torchrun: join gloo's worker threads while Python is alive (one freeing a tensor at exit aborts the rank)
if torch.distributed.is_initialized():
    torch.distributed.destroy_process_group()
print(rec.path)
