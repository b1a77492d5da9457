"""Imports sit at the top of a module, where a reader looks for what it depends on.  An import of a
dyntool module inside a function is allowed only when it keeps a heavy or optional library (torch,
Triton, zarr, matplotlib, Streamlit, an optional extra) off a lighter path, and then a comment
saying so (``# deferred: keeps torch off `dyntool --help```) sits on its line or in the comment just
above it (one comment above a run of imports covers the run).  And the light paths stay light:
``import dyntool`` and every ``dyntool ... --help`` import none of those libraries."""
from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import dyntool

ROOT = Path(dyntool.__file__).parent
REASON = re.compile(r"#.*\bdeferred\b")

# Modules whose function-level imports of dyntool modules are not yet moved up or explained: none
# left (issue 51, build item 2); a module put here is excused from the check until it is done.
STILL_TO_DO: frozenset = frozenset()

# The libraries neither light path imports today (bench/light_paths.py; docs/architecture.md has the numbers)
HEAVY = ("torch", "triton", "matplotlib", "streamlit", "transformers", "zarr", "numpy", "pandas", "xarray",
         "dask", "obstore", "scipy", "sklearn", "pyarrow", "tqdm")


def _own(node: ast.Import | ast.ImportFrom) -> bool:
    if isinstance(node, ast.ImportFrom):
        return node.level > 0 or (node.module or "").split(".")[0] == "dyntool"
    return any(a.name.split(".")[0] == "dyntool" for a in node.names)


def unexplained(source: str) -> list[int]:
    """Lines of the imports of dyntool modules inside a function with no reason comment."""
    lines = source.splitlines()
    inner: list[ast.Import | ast.ImportFrom] = []

    def visit(node, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                inner.append(child)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(source), False)
    explained: set[int] = set()             # last lines of the explained imports, own or not
    for node in sorted(inner, key=lambda n: n.lineno):
        first, last = node.lineno, node.end_lineno or node.lineno
        above, i = [], first - 1            # the comment block just above, if any
        while i >= 1 and lines[i - 1].strip().startswith("#"):
            above.append(lines[i - 1])
            i -= 1
        if (any(REASON.search(line) for line in lines[first - 1:last] + above)
                or first - 1 in explained):
            explained.add(last)
    return [n.lineno for n in inner if _own(n) and (n.end_lineno or n.lineno) not in explained]


def test_the_check_sees_an_unexplained_import():
    src = ("from . import top\n"
           "def f():\n"
           "    from . import a\n"
           "    from . import b          # deferred: keeps torch off `import dyntool`\n"
           "    # deferred: keeps zarr off `dyntool --help`\n"
           "    from .c import (x,\n"
           "                    y)\n"
           "    import torch\n"
           "    from dyntool import d\n"
           "    import json\n"
           "    from ..e import z\n"
           "class C:\n"
           "    def g(self):\n"
           "        return lambda: __import__('x')\n"
           "    def h(self):\n"
           "        import dyntool.f\n")
    # a (no comment above it, none on its line) and dyntool.f; c by the comment above it, the
    # imports after c up to e by being in c's run
    assert unexplained(src) == [3, 16]
    assert unexplained(src.replace("    import json\n", "    pass\n")) == [3, 11, 16]


def test_every_function_level_import_of_dyntool_says_why():
    found = []
    for p in sorted(ROOT.rglob("*.py")):
        rel = p.relative_to(ROOT).as_posix()
        if rel not in STILL_TO_DO:
            found += [f"dyntool/{rel}:{n}" for n in unexplained(p.read_text())]
    assert not found, ("an import inside a function that keeps no heavy library off a light path belongs at the "
                       "top of the module; one that does says which with a '# deferred: ...' comment: "
                       + ", ".join(found))


def _loaded(code: str) -> list[str]:
    r = subprocess.run([sys.executable, "-c", code + "\nimport json, sys\n"
                        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT.parent)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_import_dyntool_stays_light():
    assert _loaded("import dyntool") == []


def test_every_help_stays_light():
    """``dyntool --help`` and each command's ``--help`` (every command module's parser is built for
    any of them), in one fresh interpreter."""
    code = """
import argparse, contextlib, io
from dyntool.cli import build_parser, main

def commands(p, prefix=()):
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield (*prefix, name)
                yield from commands(sub, (*prefix, name))

argvs = [[]] + [list(c) for c in commands(build_parser())]
assert len(argvs) > 10, argvs
for argv in argvs:
    with contextlib.redirect_stdout(io.StringIO()) as out:
        try:
            main([*argv, "--help"])
        except SystemExit as e:
            assert e.code == 0, (argv, e.code)
    assert "usage:" in out.getvalue(), argv
"""
    assert _loaded(code) == []
