#!/usr/bin/env bash
# One-command set-up on a fresh machine: a virtual environment in .venv with
# every pinned dependency and fairseq_hybrid installed in editable mode.
# Safe to rerun: satisfied pins install nothing.
#
# GPU users: set TORCH_SPEC to a CUDA build of the same release, e.g.
#   TORCH_SPEC="torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128" bash scripts/setup.sh
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"

python_bin="${PYTHON:-python3.11}"
command -v "$python_bin" >/dev/null || python_bin=python3
"$python_bin" -c 'import sys; assert sys.version_info[:2] == (3, 11), sys.version' \
  || { echo "error: Python 3.11 is required (set PYTHON=/path/to/python3.11)" >&2; exit 2; }

[[ -x .venv/bin/python ]] || "$python_bin" -m venv .venv
py=.venv/bin/python
pip_install() { "$py" -m pip install --disable-pip-version-check --quiet "$@"; }

echo "[setup] build tools and torch (CPU build unless TORCH_SPEC says otherwise)"
# torch first: any later requirement that names torch is then already met
# instead of pulling a multi-GB CUDA build.
# shellcheck disable=SC2086
pip_install ${TORCH_SPEC:-torch==2.13.0} setuptools==84.2.1 wheel==0.48.0 cython==3.3.1 numpy==2.4.6

echo "[setup] fairseq-fixed (official fairseq 0.12.2 does not import on Python 3.11); first build takes ~4 minutes"
pip_install --no-build-isolation fairseq-fixed==0.12.3.1

echo "[setup] tokenisers, scoring, tests (pytest, and pytest-xdist for one test process per core), plots, tensorboard logging"
pip_install sentencepiece==0.2.3 'sacrebleu[ja]==2.6.0' mecab-python3==1.0.12 ipadic==1.0.0 \
  omegaconf==2.3.0 hydra-core==1.3.2 pytest==9.2.0 pytest-xdist==3.8.0 execnet==2.1.2 matplotlib==3.11.2 \
  tensorboardX==2.6.5 protobuf==7.36.2
# fairseq-fixed pulls torchaudio, which does not load beside the CPU torch;
# nothing here uses it, and an absent module fails cleanly where a broken one crashes.
"$py" -m pip uninstall --quiet -y torchaudio 2>/dev/null || true

echo "[setup] fairseq_hybrid (editable)"
pip_install --no-build-isolation --no-deps -e .

"$py" -c "import fairseq_hybrid, fairseq, torch; print('[setup] ok: fairseq_hybrid', fairseq_hybrid.__version__, '| fairseq', fairseq.__version__, '| torch', torch.__version__)"
