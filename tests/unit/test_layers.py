"""The import graph of ``dyntool`` has no loop: no strongly connected component larger than one
module, counting each package ``__init__`` as a module and seeing imports inside functions too
(grimp, which import-linter uses, reads every import statement).  The layers themselves are the
import-linter contract in pyproject.toml (``lint-imports``, run by scripts/test.sh)."""
from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp", reason="grimp not installed (pip install 'dyntool[test]')")


def strongly_connected(edges: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm, iterative: the components of more than one node."""
    index, low, on, stack, out, n = {}, {}, set(), [], [], 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(edges[root]))]
        index[root] = low[root] = n
        n += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = set()
                    while True:
                        x = stack.pop()
                        on.discard(x)
                        comp.add(x)
                        if x == v:
                            break
                    if len(comp) > 1:
                        out.append(comp)
            elif w not in index:
                index[w] = low[w] = n
                n += 1
                stack.append(w)
                on.add(w)
                work.append((w, iter(edges.get(w, ()))))
            elif w in on:
                low[v] = min(low[v], index[w])
    return out


def test_the_loop_finder_finds_loops():
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_dyntool_has_no_import_loop():
    g = grimp.build_graph("dyntool")
    edges = {m: set(g.find_modules_directly_imported_by(m)) for m in g.modules}
    loops = strongly_connected(edges)
    assert loops == [], "import loops: " + "; ".join(" <-> ".join(sorted(c)) for c in loops)


def test_no_private_name_is_imported_from_another_module():
    """A name another module imports is public (and documented where it is defined): no
    ``from .x import _name`` anywhere in dyntool."""
    import ast
    from pathlib import Path

    import dyntool
    root = Path(dyntool.__file__).parent
    found = []
    for p in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module != "__future__":
                found += [f"{p.relative_to(root)}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == [], found


def test_no_private_name_is_read_from_another_module():
    """Nor read as an attribute: ``module._name`` of an imported dyntool module, or ``obj._name``
    where ``_name`` is defined only in other modules (``FlightRecorder._attached`` read by a trainer,
    ``sources._repo_root`` by the WikiText loader).  ``self``/``cls`` attributes are the class's own."""
    import ast
    from pathlib import Path

    import dyntool
    root = Path(dyntool.__file__).parent
    private = lambda s: s.startswith("_") and not s.startswith("__")          # noqa: E731
    trees = {p: ast.parse(p.read_text()) for p in sorted(root.rglob("*.py"))}
    defined: dict[Path, set[str]] = {}
    for p, tree in trees.items():
        names = set()
        for n in ast.walk(tree):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
        defined[p] = {x for x in names if private(x)}
    elsewhere = {x for names in defined.values() for x in names}
    found = []
    for p, tree in trees.items():
        modules = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                   and (n.level or (n.module or "").startswith("dyntool")) for a in n.names}
        for n in ast.walk(tree):
            if not (isinstance(n, ast.Attribute) and private(n.attr)):
                continue
            base = n.value.id if isinstance(n.value, ast.Name) else None
            if base in ("self", "cls"):
                continue
            if (base in modules and n.attr in elsewhere) or (n.attr in elsewhere and n.attr not in defined[p]):
                found.append(f"{p.relative_to(root)}:{n.lineno} {ast.unparse(n)}")
    assert found == [], found
