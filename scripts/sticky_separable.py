"""The sticky chain on the separable model (dyntool/sims/separable.py): values ×10 vs readout ×10
vs routing ×10 vs all, with norm-matched controls, 10 seeds; prints the tables, writes summary.json.

    python scripts/sticky_separable.py [--steps 1000] [--T 500] [--lr 0.01] [--out runs/separable]
"""
import argparse
import json
from pathlib import Path

from dyntool.sims.separable import SeparableConfig, summarise, table, train

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--T", type=int, default=500)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--seeds", default="42,2024,1337,7777,9999,1,2,3,4,5")
p.add_argument("--out", default="runs/separable")
a = p.parse_args()
cfg = SeparableConfig(seeds=[int(s) for s in a.seeds.split(",")], steps=a.steps, T=a.T, lr=a.lr)
summ = summarise(cfg, train(cfg))
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
(out / "summary.json").write_text(json.dumps(summ, indent=1, default=float))
print(table(summ))
