"""Install as written: every extra the docs name exists, and every documented pip command that
installs extras keeps the installed torch (names it, or goes through scripts/setup.sh)."""
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "examples").glob("*.py"))]


def _extras() -> set[str]:
    return set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])


def _named_extras(text: str) -> set[str]:
    out = set()
    for group in re.findall(r"(?:dyntool|\.)\[([a-z0-9_,\- ]+)\]", text):
        out.update(e.strip() for e in group.split(","))
    return out


def test_every_extra_the_docs_name_exists():
    extras = _extras()
    for f in DOCS:
        missing = _named_extras(f.read_text()) - extras
        assert not missing, f"{f.name} names extras pyproject.toml lacks: {sorted(missing)}"
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert _named_extras(setup) <= extras


def test_documented_pip_commands_with_extras_pin_torch():
    for f in DOCS:
        for line in f.read_text().splitlines():
            if "pip install" in line and _named_extras(line):
                assert "torch==" in line, f"{f.name}: {line.strip()!r} would let pip replace torch"


def test_the_checks_can_fail():
    assert _named_extras('pip install -e ".[hf,dev]"') == {"hf", "dev"}
    assert "dev" not in _extras()
