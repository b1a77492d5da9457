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


def _stand_in_python(tmp_path, pip_lines: str, pip_rc: int = 0):
    """An interpreter whose ``-m pip`` logs its arguments and prints ``pip_lines`` (pip's own output
    format) instead of installing; anything else is the real interpreter."""
    import sys
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(f'#!/usr/bin/env bash\nif [ "$1" = "-m" ] && [ "$2" = pip ]; then echo "$@" >> {log}; '
                    f"printf '%s' '{pip_lines}'; exit {pip_rc}; fi\nexec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    return fake, log


def _setup(fake, *argv):
    import os
    import subprocess
    return subprocess.run(["bash", str(REPO / "scripts" / "setup.sh"), *argv], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": str(fake), "TMPDIR": str(fake.parent)}, timeout=60)


def test_setup_prints_a_line_of_its_own_per_stage_not_minutes_of_quiet_pip(tmp_path):
    """Issue 50 item 4: ``setup.sh`` ran ``pip -q`` for minutes without a line of its own.  With a
    stand-in interpreter whose pip prints 23 requirements, a line per stage (torch, dyntool), one
    every 10 packages resolved, the install's count and the total time; pip keeps the installed
    torch (pinned to its version) and its log is removed."""
    import importlib.metadata
    import re
    pip = "".join(f"Collecting pkg{i}>=1.0\n  Downloading pkg{i}-1.0.whl (1 kB)\n" for i in range(1, 24))
    pip += "Installing collected packages: pkg1, pkg2, pkg3\nSuccessfully installed pkg1-1 pkg2-1 pkg3-1\n"
    fake, log = _stand_in_python(tmp_path, pip)
    p = _setup(fake, "all")
    assert p.returncode == 0, p.stderr
    lines = [re.sub(r" \(\d+ s\)$", "", ln) for ln in p.stdout.splitlines()]      # the times cut off
    assert lines[0] == f"setup: [1/2] torch is installed in {fake}; it is kept", lines
    assert lines[1].startswith("setup: [2/2] installing dyntool all (.[test,") and "1-4 minutes" in lines[1], lines
    assert lines[2:-1] == [f"setup:   resolving and downloading: package {n} (pkg{n}>=1.0)" for n in (1, 11, 21)] + \
        ["setup:   installing 3 packages", "setup:   installed 3 packages"], lines
    assert p.stdout.splitlines()[-1].startswith("setup: done in ") and not p.stderr
    torch = importlib.metadata.version("torch").split("+")[0]
    assert log.read_text().split()[-1] == f"torch=={torch}"
    assert [f.name for f in tmp_path.iterdir() if f.name.startswith("dyntool-setup")] == []
    bad = _setup(fake, "everything")
    assert bad.returncode == 2 and "unknown argument" in bad.stderr and not bad.stdout


def test_setup_shows_pips_error_and_where_its_whole_output_is(tmp_path):
    """pip failing: its ERROR line as it comes, then its last lines and the log's path, exit 1."""
    fake, _ = _stand_in_python(tmp_path, "Collecting nosuchpkg\nERROR: No matching distribution found for nosuchpkg\n",
                               pip_rc=1)
    p = _setup(fake)
    assert p.returncode == 1 and "ERROR: No matching distribution found for nosuchpkg" in p.stdout, p.stdout
    logs = [f for f in tmp_path.iterdir() if f.name.startswith("dyntool-setup")]
    assert len(logs) == 1 and f"all of it in {logs[0]}" in p.stderr and "nosuchpkg" in logs[0].read_text()
    assert "setup: done" not in p.stdout
