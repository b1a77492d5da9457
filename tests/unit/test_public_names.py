"""Every name a package docstring advertises can be imported (``import dyntool.train as t;
t.run_training`` once pointed at a module that no longer existed)."""
import ast
import importlib
import re
from pathlib import Path

import pytest

import dyntool

PACKAGES = sorted(p for p in Path(dyntool.__file__).parent.rglob("__init__.py") if "app/views" not in str(p))


def _advertised(init: Path) -> list[tuple[str, str]]:
    pkg = ".".join(init.parent.relative_to(Path(dyntool.__file__).parent.parent).parts)
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    found = []
    for mod, names in re.findall(r"from (dyntool[\w.]*) import ([\w, ]+)", doc):
        found += [(mod, n.strip()) for n in names.split(",") if n.strip()]
    # ``run_training(...)``, but not a protocol's methods ("a sink has ``log(step, scalars)``")
    found += [(pkg, n) for n in re.findall(r"(?<!has )(?<!and )``(\w+)\(", doc)]
    found += [(pkg, n) for n in re.findall(r":class:`(\w+)`", doc)]             # :class:`RunRecorder`
    found += [("dyntool", n) for n in re.findall(r"\bdyntool\.(\w+)\(", doc)]   # dyntool.open_run(...)
    return found


CASES = sorted({c for init in PACKAGES for c in _advertised(init)})


def test_the_docstrings_advertise_something():
    assert ("dyntool.train", "run_training") in CASES and ("dyntool", "open_run") in CASES, CASES


@pytest.mark.parametrize("module,name", CASES)
def test_advertised_name_imports(module, name):
    mod = importlib.import_module(module)
    if module == "dyntool.adapters" and name == "Capture":    # the adapters' docstring names the public class
        mod = dyntool
    assert getattr(mod, name) is not None


def test_version_is_one_number():
    import tomllib
    meta = tomllib.loads((Path(dyntool.__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["version"] == dyntool.__version__
