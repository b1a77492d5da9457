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


def test_setup_says_what_it_does_before_and_after_the_quiet_pip(tmp_path):
    """Issue 50 item 4: ``setup.sh`` ran ``pip -q`` for minutes without a line of its own.  With a
    stand-in interpreter (imports answered by the real one, ``-m pip`` only logged), the lines
    before and after each pip call are checked, and pip is called as documented."""
    import os
    import subprocess
    import sys
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nif [ "$1" = "-m" ] && [ "$2" = pip ]; then echo "$@" >> {log}; exit 0; fi\n'
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    p = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "all"], capture_output=True, text=True,
                       env={**os.environ, "PYTHON": str(fake)}, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("setup: installing dyntool all (.[test,") and "1-4 minutes" in lines[0], lines
    assert lines[-1].startswith("setup: done in ") and lines[-1].endswith(" s"), lines
    import torch
    assert log.read_text().split()[-1] == f"torch=={torch.__version__.split('+')[0]}"
    bad = subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), "everything"], capture_output=True,
                         text=True, env={**os.environ, "PYTHON": str(fake)}, timeout=60)
    assert bad.returncode == 2 and "unknown argument" in bad.stderr and not bad.stdout
