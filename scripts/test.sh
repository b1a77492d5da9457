#!/usr/bin/env bash
# The test command (README "Tests"; CI calls this): unit + integration + acceptance tiers,
# long tests (-m slow) excluded.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh all
exec ${PYTHON:-python3} -m pytest tests "$@"
