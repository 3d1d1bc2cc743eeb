#!/usr/bin/env bash
# ASPEC-JE (licensed; not downloadable here) from the raw corpus to BLEU,
# both directions, with hybrid_lstm.
#
#   bash recipes/aspec_ja_en/run.sh --aspec-dir /data/ASPEC/ASPEC-JE            # CUDA if present
#   bash recipes/aspec_ja_en/run.sh --aspec-dir /data/ASPEC/ASPEC-JE --gpus 4   # one 4-GPU hybrid group
#   bash recipes/aspec_ja_en/run.sh --aspec-dir DIR --tiny --device cpu         # smoke run
#
# Reads train/train-{1,2,3}.txt (score ||| doc-id ||| sent-id ||| ja ||| en) and
# dev/dev.txt, devtest/devtest.txt, test/test.txt (doc-id ||| sent-id ||| ja ||| en).
# Training data: --train-files (default train-1,train-2, as commonly done at WAT),
# sentences up to --max-len 50 words; devtest selects the model, test gives the
# final score; dev is cleaned too (raw/dev.*) for your own tuning.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
recipe=aspec_ja_en

aspec_dir=""
train_files=train-1,train-2
rest=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --aspec-dir) aspec_dir="$2"; shift 2 ;;
    --train-files) train_files="$2"; shift 2 ;;
    -h|--help)
      sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
      echo "Options:"
      echo "  --aspec-dir DIR        the ASPEC-JE folder (required for the prepare step)"
      echo "  --train-files LIST     training files under train/ (default: $train_files)"
      rest=(--help); break ;;
    --) rest+=("$@"); break ;;
    *) rest+=("$1"); shift ;;
  esac
done
prepare_input=()
[[ -n "$aspec_dir" ]] && prepare_input=(--format aspec --aspec-dir "$aspec_dir" --train-files "$train_files")
prepare_missing="--aspec-dir DIR (the folder holding train/, dev/, devtest/, test/)"

# shellcheck source=../common/ja_en_pipeline.sh
source "$repo/recipes/common/ja_en_pipeline.sh" "${rest[@]}"
