#!/usr/bin/env bash
# Every test: lint, module docs, unit tests, then the molecule scenarios in local podman nodes.
set -euo pipefail
. "$(dirname "$0")/env.sh"
"$LLMTUNE_ROOT/scripts/setup-controller.sh"
cd "$LLMTUNE_ROOT"
echo "== yamllint"; yamllint -s .
echo "== ansible-lint"; ansible-lint --profile production
echo "== ansible-doc"
for module in library/*.py; do
  ansible-doc -M library "$(basename "$module" .py)" >/dev/null
done
echo "== pytest"; python -m pytest tests/unit -q
echo "== molecule"; molecule test --all
