"""The fused attention judged by what it compiles to, on a machine without a GPU.

Each Triton program is compiled for a CUDA target (sm_90, the H100, by default) by the Triton wheel's
own compiler, with the specialisation a GPU run gets: bf16 tensors, GPT-2's strides (q, k, v are
views of one (B, T, 3C) projection), every pointer and every stride divisible by 16.  The cubin is
then read with the wheel's own ``cuobjdump`` (registers, local memory) and ``nvdisasm`` (SASS with
source lines), and each innermost loop is counted per iteration: total instructions, MUFU (the
special-function unit: exp2, log2, rcp), FSETP (a float compare: a ``where`` on floats, or the
non-ftz exp fix-up), ISETP + FSEL (integer compares and selects: masks), LDSM + STSM (register
tiles moved through shared memory: a ``tl.trans`` of a register tile) and BAR (the barriers around
them and the pipeline's), HGMMA (the tensor-core instructions, the work itself).  A loop is *hot* when its ``for`` line carries the comment
``# hot loop``: the off-band tiles that make up nearly every iteration of a long sequence.

    python bench/kernel_census.py [--d 64,128] [--json out.json]   # the table; tests/kernels/test_census.py

The occupancy model is the H100's: 65,536 registers per SM allocated 256 per warp, 228 KiB of
shared memory (1 KiB reserved per block), 64 warps and 32 blocks per SM.
"""
from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

REGS_PER_SM, REG_UNIT, SMEM_PER_SM, SMEM_RESERVED, WARPS_PER_SM, BLOCKS_PER_SM = 65536, 256, 233472, 1024, 64, 32
HOT_MARK = "# hot loop"
# the families counted per loop iteration; the keys are the census's public names
FAMILIES = {"mufu": ("MUFU",), "fsetp": ("FSETP",), "isetp_fsel": ("ISETP", "FSEL"),
            "ldsm_stsm": ("LDSM", "STSM"), "bar": ("BAR",), "hgmma": ("HGMMA",), "local": ("LDL", "STL")}


@dataclasses.dataclass
class Loop:
    source: str            # "forward.py:66": the file and line of its back-edge (the `for`)
    hot: bool
    instructions: int
    counts: dict           # FAMILIES name → instructions per iteration

    def row(self) -> dict:
        return {"source": self.source, "hot": self.hot, "instructions": self.instructions, **self.counts}


@dataclasses.dataclass
class Program:
    name: str
    registers: int
    local_bytes: int       # spills (and any local array): 0 in a kernel that fits its registers
    shared_bytes: int
    warps: int
    loops: list

    @property
    def blocks_per_sm(self) -> int:
        per_warp = -(-self.registers * 32 // REG_UNIT) * REG_UNIT
        by_regs = REGS_PER_SM // (per_warp * self.warps) if self.registers else BLOCKS_PER_SM
        by_smem = SMEM_PER_SM // (self.shared_bytes + SMEM_RESERVED)
        return min(by_regs, by_smem, WARPS_PER_SM // self.warps, BLOCKS_PER_SM)

    @property
    def hot_loops(self) -> list:
        return [lp for lp in self.loops if lp.hot]

    @property
    def spills(self) -> int:
        return self.local_bytes + sum(lp.counts["local"] for lp in self.loops)

    def row(self) -> dict:
        return {"program": self.name, "registers": self.registers, "spill_bytes": self.local_bytes,
                "shared_bytes": self.shared_bytes, "warps": self.warps, "blocks_per_sm": self.blocks_per_sm,
                "loops": [lp.row() for lp in self.loops]}


def _tool(name: str) -> str:
    import triton                 # the wheel ships the tools beside its ptxas
    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} is not in this Triton wheel ({path})")
    return str(path)


_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_INSN = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")
_LABEL = re.compile(r"^(\.L_x_\d+):")
_TARGET = re.compile(r"`\((\.L_x_\d+)\)")


def sass(cubin: bytes) -> list[tuple[int, str, str, str]]:
    """(address, opcode, operands, "file:line") for every instruction; labels as opcode ``LABEL``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([_tool("nvdisasm"), "-c", "-gi", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    out, where, last = [], "?", 0
    for line in text.splitlines():
        if m := _LINE.search(line):
            where = f"{Path(m.group(1)).name}:{m.group(2)}"
        elif m := _LABEL.match(line.strip()):
            out.append((last + 16, "LABEL", m.group(1), where))
        elif m := _INSN.search(line):
            last = int(m.group(1), 16)
            out.append((last, m.group(2), m.group(3), where))
    return out


def _hot_lines(sources: dict[str, list[str]], where: str) -> bool:
    name, _, line = where.rpartition(":")
    lines = sources.get(name)
    return bool(lines) and line.isdigit() and HOT_MARK in lines[int(line) - 1]


def loops(insns: list, sources: dict[str, list[str]]) -> list[Loop]:
    """The innermost loops: a branch back to a label at or before it spans [label, branch]."""
    labels = {ops: addr for addr, op, ops, _ in insns if op == "LABEL"}
    spans = []
    for addr, op, ops, where in insns:
        if op.startswith("BRA") and (t := _TARGET.search(ops)) and labels.get(t.group(1), addr + 1) < addr:
            spans.append((labels[t.group(1)], addr, where))
    inner = [s for s in spans if not any(o is not s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    found = []
    for lo, hi, where in inner:
        body = [op for addr, op, _, _ in insns if lo <= addr <= hi and op != "LABEL"]
        bases = Counter(op.split(".")[0] for op in body)
        counts = {k: sum(bases[b] for b in fam) for k, fam in FAMILIES.items()}
        found.append(Loop(where, _hot_lines(sources, where), len(body), counts))
    return found


def _resources(cubin: bytes) -> tuple[int, int, int]:
    with tempfile.NamedTemporaryFile(suffix=".cubin", delete=False) as f:
        f.write(cubin)
    try:
        text = subprocess.run([_tool("cuobjdump"), "-res-usage", f.name], capture_output=True, text=True,
                              check=True).stdout
    finally:
        os.unlink(f.name)
    get = lambda key: int(re.search(rf"{key}:(\d+)", text).group(1))   # noqa: E731
    return get("REG"), get("LOCAL"), get("SHARED")


# ---- the specialisation a GPU run gets ----------------------------------------------------------

INT32_POINTERS = {"LO", "HI", "WIN"}
INT8_POINTERS = {"KM"}
ELEMENT_POINTERS = {"Q", "K", "V", "O", "DO", "DQ", "DK", "DV"}
FLOATS = {"scale", "softcap"}


def gpt2_ints(T: int = 2048, H: int = 12, D: int = 64, B: int = 4) -> dict[str, int]:
    """The integer arguments of GPT-2 small at sequence length T: q, k, v views of the (B, T, 3C)
    projection, out and the gradients in (B, T, H, D)."""
    C = H * D
    qkv = dict(b=T * 3 * C, h=D, t=3 * C)
    bthd = dict(b=T * C, h=D, t=C)
    ints = {"H": H, "G": 1, "T": T, "Tk": T, "D": D, "skmb": T}
    for p in "qkv":
        ints.update({f"s{p}{a}": s for a, s in qkv.items()})
    for p in ("o", "d", "dq", "dk", "dv"):
        ints.update({f"s{p}{a}": s for a, s in bthd.items()})
    return ints


def compile_program(fn, constexprs: dict, *, dtype: str = "bf16", floats: str = "fp64", ints: dict | None = None,
                    num_warps: int = 4, num_stages: int = 3, arch: int = 90, maxnreg: int | None = None,
                    fp32_pointers: frozenset = frozenset()):
    """``fn`` compiled for sm_``arch`` as a launch with these arguments would be; the integer arguments
    divisible by 16 are specialised so (Triton's ``tt.divisibility``), as on a GPU.  ``fp32_pointers``:
    element pointers that are float32 in this launch (the atomic policy's dQ accumulator)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    ints = {**gpt2_ints(), **(ints or {})}
    sig, attrs = {}, {}
    for i, p in enumerate(fn.params):
        n = p.name
        if p.is_constexpr:
            sig[n] = "constexpr"
            continue
        if n in FLOATS:
            sig[n] = floats
        elif n.isupper() and n not in ("H", "G", "T", "D"):
            sig[n] = ("*i32" if n in INT32_POINTERS else "*i8" if n in INT8_POINTERS
                      else f"*{dtype}" if n in ELEMENT_POINTERS - fp32_pointers else "*fp32")
            attrs[(i,)] = [["tt.divisibility", 16]]          # torch's allocations are 16-byte aligned
        else:
            sig[n] = "i32"
            if ints.get(n, 1) % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    missing = {p.name for p in fn.params if p.is_constexpr} - set(constexprs)
    if missing:
        raise KeyError(f"{fn.__name__}: no value for the switches {sorted(missing)}")
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                          target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps,
                                                                       "num_stages": num_stages, "maxnreg": maxnreg})


def program_census(fn, constexprs: dict, **kw) -> Program:
    kernel = compile_program(fn, constexprs, **kw)
    cubin = kernel.asm["cubin"]
    regs, local, static_smem = _resources(cubin)
    src = Path(fn.fn.__code__.co_filename).parent
    sources = {p.name: p.read_text().splitlines() for p in src.glob("*.py")}
    return Program(fn.__name__, regs, local, static_smem + kernel.metadata.shared, kw.get("num_warps", 4),
                   loops(sass(cubin), sources))


# ---- the fused attention's programs, as a GPU run of GPT-2's shape compiles them ------------------

# per-iteration bounds of the hot loops (issue 45), with the statistics on
HOT_BOUNDS = {"attn_fwd": 400, "attn_bwd_dq": 300, "attn_bwd_dkdv": 350}
# the atomic-dQ policy's one backward loop does the work of both of the split's (5 matmul units of 7)
HOT_BOUNDS_ATOMIC = {"attn_bwd_dkdv+dq": 460}


def attention_census(D: int = 64, *, stats: bool = True, T: int = 2048, H: int = 12, arch: int = 90,
                     dq: str = "split") -> list[Program]:
    """Every program of :mod:`dyntool.kernels` for the common case a recorded GPT step runs (causal,
    no padding, soft-cap, ALiBi, window or sinks; bf16), with the tiles, warps and stages
    :func:`dyntool.kernels.op.tiles` gives a GPU, at head dimension D, under a dQ policy
    (:func:`dyntool.kernels.op.dq_policy`): with ``atomic`` the dQ program only prepares D (no loop)
    and the dK/dV program, named ``attn_bwd_dkdv+dq``, adds dQ."""
    # deferred: torch and Triton load only to compile (the SASS parser and the occupancy model don't need them)
    import triton
    from . import backward as bw
    from . import forward as fw
    from . import op
    t = op.tiles(D, gpu=True, dq=dq)
    d_pad = max(16, triton.next_power_of_2(D))
    switches = dict(D_PAD=d_pad, EVEN_D=d_pad == D, GROUPED=False, CAUSAL=True, HAS_WINDOW=False, HAS_SOFTCAP=False,
                    HAS_ALIBI=False, HAS_KM=False, HAS_SINK=False, STATS=stats, PRECISION="tf32",
                    PRE_ONLY=dq == "atomic", ATOMIC_DQ=dq == "atomic")
    ints = {**gpt2_ints(T=T, H=H, D=D)}
    out = []
    for fn, (bm, bn) in ((fw.attn_fwd, (t.m, t.n)), (bw.attn_bwd_dq, (t.m, t.n)), (bw.attn_bwd_dkdv, (t.kv_m, t.kv))):
        names = {p.name for p in fn.params if p.is_constexpr}
        const = {k: v for k, v in {**switches, "BLOCK_M": bm, "BLOCK_N": bn}.items() if k in names}
        tp = t.dkdv() if fn is bw.attn_bwd_dkdv else t
        prog = program_census(fn, const, ints=ints, num_warps=tp.warps or 4, num_stages=tp.stages or 3, arch=arch,
                              fp32_pointers=frozenset({"DQ"} if const.get("ATOMIC_DQ") else ()))
        if const.get("ATOMIC_DQ"):
            prog = dataclasses.replace(prog, name=prog.name + "+dq")
        out.append(prog)
    return out


def table(programs: list[Program], D: int) -> str:
    lines = [f"d = {D}: program      regs  spill  smem KiB  blocks/SM | hot loop per iteration: "
             "instr  MUFU  FSETP  ISETP+FSEL  LDSM+STSM  BAR  HGMMA"]
    for p in programs:
        hot = p.hot_loops
        loop = ("  ".join(f"{lp.instructions:5d} {lp.counts['mufu']:5d} {lp.counts['fsetp']:6d} "
                          f"{lp.counts['isetp_fsel']:11d} {lp.counts['ldsm_stsm']:10d} {lp.counts['bar']:4d} "
                          f"{lp.counts['hgmma']:6d}"
                          for lp in hot) or "no hot loop found")
        lines.append(f"        {p.name:<15} {p.registers:4d} {p.spills:6d} {p.shared_bytes / 1024:9.1f} "
                     f"{p.blocks_per_sm:10d} | {loop}")
    return "\n".join(lines)
