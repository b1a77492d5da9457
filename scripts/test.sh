#!/usr/bin/env bash
# The test command (README "Tests"; CI calls this): unit + integration + acceptance tiers,
# long tests (-m slow) excluded.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh all
# the layering contract of pyproject.toml ([tool.importlinter]): imports only downward, no loops
${PYTHON:-python3} -c "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"
exec ${PYTHON:-python3} -m pytest tests "$@"
