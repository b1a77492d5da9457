"""The sticky chain on the separable model (dyntool/sims/separable.py): values ×10 vs readout ×10
vs routing ×10 vs all, with norm-matched controls, 10 seeds; prints the tables, writes summary.json.

    python scripts/sticky_separable.py [--steps 1000] [--T 500] [--lr 0.01] [--out runs/separable]
                                       [--device cpu|cuda|cuda:N]

``--device cuda`` exists but has not been run on a GPU yet; a device this machine lacks is one line on
stderr and exit 2, before anything is written.
"""
import argparse
import json
import sys
from pathlib import Path

from dyntool.errors import ConfigError
from dyntool.sims.separable import SeparableConfig, summarise, table, train

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=1000)
p.add_argument("--T", type=int, default=500)
p.add_argument("--lr", type=float, default=0.01)
p.add_argument("--seeds", default="42,2024,1337,7777,9999,1,2,3,4,5")
p.add_argument("--out", default="runs/separable")
p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N; data is made on the CPU either way")
a = p.parse_args()
cfg = SeparableConfig(seeds=[int(s) for s in a.seeds.split(",")], steps=a.steps, T=a.T, lr=a.lr, device=a.device)
try:
    cfg.validate()                    # the device too: refused before training and before --out is made
except ConfigError as e:
    print(f"sticky_separable.py: error: {e}", file=sys.stderr)      # one line, exit 2 as dyntool's CLI
    sys.exit(2)
summ = summarise(cfg, train(cfg))
out = Path(a.out)
out.mkdir(parents=True, exist_ok=True)
(out / "summary.json").write_text(json.dumps(summ, indent=1, default=float))
print(table(summ))
