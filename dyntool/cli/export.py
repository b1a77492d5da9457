"""``dyntool export RUN``: metrics to Parquet/CSV, arrays to NetCDF/npz, scalars to TensorBoard/W&B."""
from __future__ import annotations

import sys
from pathlib import Path

from ..errors import DyntoolError


def cmd_export(args) -> int:
    # deferred: keeps zarr off `dyntool --help` (every command's parser is built for it)
    from ..export import ExportError, check_destination, check_readable, export_run, parse_formats
    from ..run import open_run
    if not (args.to or args.to_tensorboard or args.to_wandb):
        raise ExportError("nothing to do: give --to DIR (with --format), --to-tensorboard DIR or --to-wandb PROJECT")
    formats = parse_formats(args.format) if args.to else []
    arrays = [a.strip() for a in args.arrays.split(",") if a.strip()] if args.arrays else None
    for dest, flag in ((args.to, "--to"), (args.to_tensorboard, "--to-tensorboard")):
        if dest is not None:
            check_destination(dest, flag)
    if args.to_tensorboard:     # a second event file in one folder: TensorBoard shows every scalar twice
        old = sorted(Path(args.to_tensorboard).glob("events.out.tfevents*"))
        if old:
            raise ExportError(f"--to-tensorboard {args.to_tensorboard} already holds an event file ({old[0].name}); "
                              "TensorBoard would show its scalars twice: give a new or empty folder")
    run = open_run(args.run)
    if args.to_tensorboard or args.to_wandb:
        check_readable(run, [], metrics=True)           # scalars: the metrics must be readable
    if args.to:
        for p in export_run(run, args.to, formats, arrays, args.steps):
            print(p)
    if args.to_tensorboard or args.to_wandb:
        from ..sinks import TensorBoardSink, WandbSink, export_scalars   # deferred: as the run's imports
        sink = TensorBoardSink(args.to_tensorboard) if args.to_tensorboard else WandbSink(args.to_wandb, run)
        try:
            n = export_scalars(run, sink, args.steps)
        except DyntoolError:
            sink.close(remove=True)
            raise
        sink.close()
        print(f"{n} scalars -> {args.to_tensorboard or 'wandb project ' + args.to_wandb}")
    problems = run.problems                 # what could not be read is said (as `check` does), once
    if problems:
        more = f" (+{len(problems) - 1} more: dyntool check {args.run})" if len(problems) > 1 else ""
        print(f"dyntool: warning: {run.id}: exported what reads; not read: {problems[0]}{more}", file=sys.stderr)
    return 0


def register(sub, simsub) -> None:
    ex = sub.add_parser("export", help="metrics to Parquet/CSV, arrays to NetCDF/npz, scalars to TensorBoard",
                        description="Export one run to open formats (files: metrics.parquet, metrics.csv, "
                                    "arrays.nc, arrays.npz). Never overwrites; all or nothing.")
    ex.add_argument("run", metavar="RUN", help="the run directory to export")
    ex.add_argument("--to", metavar="DIR", help="output directory for --format files")
    ex.add_argument("--format", default="parquet,netcdf",
                    help="comma-separated: parquet,csv (metrics), netcdf,npz (arrays); default parquet,netcdf")
    ex.add_argument("--arrays", metavar="NAME,...", help="recorded arrays to export (default: all)")
    ex.add_argument("--at-steps", dest="steps", metavar="SPEC", help="which recorded training steps: N, A:B (A <= step < B), last; comma-separated (default: all)")
    ex.add_argument("--to-tensorboard", metavar="DIR", help="per-step scalars (metrics, per-head max|logit|, "
                                                            "entropy) as a TensorBoard event file in DIR")
    ex.add_argument("--to-wandb", metavar="PROJECT", help="the same scalars to Weights & Biases (needs wandb)")
    ex.set_defaults(fn=cmd_export)
