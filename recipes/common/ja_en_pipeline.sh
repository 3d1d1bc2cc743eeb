# Shared steps of the licensed-corpus recipes (aspec_ja_en, patent_ja_en):
# sourced by their run.sh after they have set
#   recipe          name of the work folder (work/$recipe)
#   prepare_input   arguments of scripts/prepare_licensed_corpus.py naming the corpus
#                   (empty when not given; then prepare_missing says what is needed)
# and with the remaining command-line arguments.
#
# Steps (each skipped when already done; rerun the same command to resume):
#   prepare   clean (summary of every dropped line in raw/prepare_summary.txt),
#             sentencepiece, fairseq-preprocess for each direction
#   train     fairseq-train for each direction (resumes from checkpoint_last.pt)
#   generate  fairseq-generate with checkpoint_best.pt (best devtest/valid loss)
#             on the valid and test splits
#   score     sacrebleu BLEU (tokenizer 13a for English output, ja-mecab for
#             Japanese output) and chrF, with signatures

pipeline_usage() {
  cat <<'USAGE'
Common options:
  --work-dir DIR         data, checkpoints and scores (default: work/RECIPE)
  --steps LIST           comma-separated subset of prepare,train,generate,score (default: all)
  --directions LIST      ja-en, en-ja or both (default: ja-en,en-ja)
  --device cpu|cuda      where to train and translate (default: cuda when available)
  --gpus K               CUDA devices: 1 trains on cuda:0; K > 1 trains one hybrid group
                         with --hybrid-devices cuda:0,...,cuda:K-1 (default: 1)
  --arch NAME            a hybrid_lstm preset (default: hybrid_lstm_paper; --tiny: hybrid_lstm_tiny)
  --max-update N         training budget in updates (default: 100000; --tiny: 30)
  --max-tokens N         target+source tokens per batch per update (default: 4096; --tiny: 1000)
  --vocab-size N         sentencepiece pieces (default: 32000 joint; --tiny: 2000)
  --separate-vocab       one sentencepiece model and dictionary per language
  --mecab                segment Japanese into MeCab words before sentencepiece
  --max-len N            longest training sentence in words (default: 50; 0: no limit)
  --tiny                 a smoke run in a few minutes on the CPU (tests and CI)
  --threads N            CPU threads (default: 2)
  -- ARGS                further arguments for fairseq-train
USAGE
}

work="$repo/work/$recipe"
steps=prepare,train,generate,score
directions=ja-en,en-ja
device=""
gpus=1
arch=""
max_update=""
max_tokens=""
vocab_size=""
separate_vocab=0
mecab=0
max_len=50
tiny=0
threads=2
extra_train_args=()

while [[ $# -gt 0 ]]; do
  case "$1" in
    --work-dir) work="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    --directions) directions="$2"; shift 2 ;;
    --device) device="$2"; shift 2 ;;
    --gpus) gpus="$2"; shift 2 ;;
    --arch) arch="$2"; shift 2 ;;
    --max-update) max_update="$2"; shift 2 ;;
    --max-tokens) max_tokens="$2"; shift 2 ;;
    --vocab-size) vocab_size="$2"; shift 2 ;;
    --separate-vocab) separate_vocab=1; shift ;;
    --mecab) mecab=1; shift ;;
    --max-len) max_len="$2"; shift 2 ;;
    --tiny) tiny=1; shift ;;
    --threads) threads="$2"; shift 2 ;;
    -h|--help) pipeline_usage; exit 0 ;;
    --) shift; extra_train_args=("$@"); break ;;
    *) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done

has_step() { [[ ",$steps," == *",$1,"* ]]; }
for step in ${steps//,/ }; do
  [[ ",prepare,train,generate,score," == *",$step,"* ]] || { echo "error: unknown step '$step' in --steps" >&2; exit 2; }
done
for direction in ${directions//,/ }; do
  [[ "$direction" == ja-en || "$direction" == en-ja ]] || { echo "error: --directions: '$direction' is not ja-en or en-ja" >&2; exit 2; }
done
if has_step prepare && [[ ${#prepare_input[@]} -eq 0 ]]; then
  echo "error: the prepare step needs $prepare_missing" >&2; exit 2
fi
[[ "$gpus" =~ ^[1-9][0-9]*$ ]] || { echo "error: --gpus must be a positive count, got '$gpus'" >&2; exit 2; }

if [[ -x "$repo/.venv/bin/python" && -z "${VIRTUAL_ENV:-}" ]]; then
  # shellcheck disable=SC1091
  source "$repo/.venv/bin/activate"
fi
command -v fairseq-train >/dev/null || { echo "error: fairseq-train not found: run bash scripts/setup.sh first" >&2; exit 2; }

if [[ -z "$device" ]]; then
  device=$(python -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
[[ "$device" == cpu || "$device" == cuda ]] || { echo "error: --device must be cpu or cuda, got '$device'" >&2; exit 2; }
if [[ "$device" == cpu && "$gpus" != 1 ]]; then
  echo "error: --gpus $gpus needs --device cuda" >&2; exit 2
fi
if [[ $tiny == 1 ]]; then
  arch="${arch:-hybrid_lstm_tiny}"; max_update="${max_update:-30}"; max_tokens="${max_tokens:-1000}"
  vocab_size="${vocab_size:-2000}"; beam=2
else
  arch="${arch:-hybrid_lstm_paper}"; max_update="${max_update:-100000}"; max_tokens="${max_tokens:-4096}"
  vocab_size="${vocab_size:-32000}"; beam=5
fi

log() { echo "[$(date +%H:%M:%S)] $*"; }
raw="$work/raw"; spm_dir="$work/spm"
mkdir -p "$work"

if has_step prepare; then
  if [[ ! -f "$raw/prepare_summary.txt" ]]; then
    log "prepare: clean the corpus"
    clean_args=(--out "$raw" --max-tokens "$max_len")
    [[ $mecab == 1 ]] && clean_args+=(--mecab)
    python "$repo/scripts/prepare_licensed_corpus.py" "${prepare_input[@]}" "${clean_args[@]}"
  fi
  if [[ ! -f "$spm_dir/.done" ]]; then
    log "prepare: sentencepiece, $vocab_size pieces"
    spm_args=(--raw-dir "$raw" --out-dir "$spm_dir" --src ja --tgt en --splits train,valid,test
              --train-model --vocab-size "$vocab_size")
    [[ $separate_vocab == 1 ]] && spm_args+=(--separate-models)
    python "$repo/scripts/spm_encode_parallel.py" "${spm_args[@]}"
    touch "$spm_dir/.done"
  fi
  for direction in ${directions//,/ }; do
    src="${direction%-*}"; tgt="${direction#*-}"; bin="$work/bin-$direction"
    if [[ ! -f "$bin/.done" ]]; then
      log "prepare: fairseq-preprocess $direction"
      joined=(); [[ $separate_vocab == 0 ]] && joined=(--joined-dictionary)
      rm -rf "$bin.tmp"
      fairseq-preprocess --source-lang "$src" --target-lang "$tgt" "${joined[@]}" \
        --trainpref "$spm_dir/train" --validpref "$spm_dir/valid" --testpref "$spm_dir/test" \
        --destdir "$bin.tmp" --workers "$threads"
      rm -rf "$bin"; mv "$bin.tmp" "$bin"; touch "$bin/.done"
    fi
  done
fi

device_args() {
  # CPU; one GPU; or one hybrid group over K GPUs in one process
  # (--distributed-world-size 1 keeps fairseq from starting a process per GPU).
  if [[ "$device" == cpu ]]; then
    echo --cpu
  elif [[ "$gpus" == 1 ]]; then
    echo --distributed-world-size 1
  else
    echo --distributed-world-size 1 --hybrid-devices "$(seq -s, -f 'cuda:%g' 0 $((gpus - 1)))"
  fi
}

for direction in ${directions//,/ }; do
  src="${direction%-*}"; tgt="${direction#*-}"; bin="$work/bin-$direction"; run="$work/$direction/$arch"
  if has_step train; then
    [[ -f "$bin/.done" ]] || { echo "error: $bin: not prepared (run --steps prepare first)" >&2; exit 2; }
    train_key="$device $gpus $max_update $max_tokens ${extra_train_args[*]}"
    if [[ "$(cat "$run/.train_done" 2>/dev/null)" != "$train_key" ]]; then
      mkdir -p "$run"
      log "train $direction: $arch, $max_update updates, $(device_args)"
      # shellcheck disable=SC2046
      OMP_NUM_THREADS="$threads" fairseq-train "$bin" --user-dir "$repo/fairseq_hybrid" $(device_args) \
        --arch "$arch" --criterion hybrid_cross_entropy --label-smoothing 0.1 \
        --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 1.0 \
        --lr 0.001 --lr-scheduler inverse_sqrt --warmup-updates "$((max_update < 4000 ? max_update / 4 + 1 : 4000))" \
        --warmup-init-lr 1e-7 --max-tokens "$max_tokens" --max-update "$max_update" \
        --skip-invalid-size-inputs-valid-test --seed 1 --num-workers 0 \
        --save-dir "$run/checkpoints" --no-epoch-checkpoints \
        --save-interval-updates "$((max_update < 5000 ? max_update : 5000))" --keep-interval-updates 2 \
        --best-checkpoint-metric loss --log-format simple --log-interval 50 \
        "${extra_train_args[@]}" 2>&1 | tee -a "$run/train.log"
      echo "$train_key" > "$run/.train_done"
    fi
  fi

  checkpoint="$run/checkpoints/checkpoint_best.pt"
  if has_step generate; then
    [[ -f "$checkpoint" ]] || { echo "error: $checkpoint: no trained model (run --steps train first)" >&2; exit 2; }
    for split in valid test; do
      hyp="$run/hyp.$split.$tgt"
      if [[ ! -f "$hyp" || "$checkpoint" -nt "$hyp" ]]; then
        log "generate $direction: beam $beam on $split"
        cpu=(); [[ "$device" == cpu ]] && cpu=(--cpu)
        join=(); [[ "$tgt" == ja && $mecab == 1 ]] && join=(--join-japanese)
        # a source over 1024 tokens is translated from its start (and named by
        # extract_hypotheses.py), never a reason to stop the whole split
        fairseq-generate "$bin" --user-dir "$repo/fairseq_hybrid" "${cpu[@]}" --path "$checkpoint" \
          --gen-subset "$split" --beam "$beam" --max-tokens 8000 --remove-bpe sentencepiece \
          --required-batch-size-multiple 1 --truncate-source --max-source-positions 1024 \
          --skip-invalid-size-inputs-valid-test > "$run/generate.$split.out"
        python "$repo/scripts/extract_hypotheses.py" "$run/generate.$split.out" "$hyp" \
          --expect "$(wc -l < "$raw/ref/$split.$tgt")" "${join[@]}" \
          --source "$spm_dir/$split.$src" --max-source-positions 1024
      fi
    done
  fi

  if has_step score; then
    tokenize=13a; [[ "$tgt" == ja ]] && tokenize=ja-mecab
    for split in valid test; do
      [[ -f "$run/hyp.$split.$tgt" ]] || { echo "error: $run/hyp.$split.$tgt: no translations (run --steps generate first)" >&2; exit 2; }
      log "score $direction $split: sacrebleu, tokenizer $tokenize"
      sacrebleu "$raw/ref/$split.$tgt" -i "$run/hyp.$split.$tgt" -m bleu chrf --tokenize "$tokenize" \
        > "$run/score.$split.json.tmp"
      mv "$run/score.$split.json.tmp" "$run/score.$split.json"
      python - "$run/score.$split.json" "$direction" "$split" <<'PY'
import json, sys
path, direction, split = sys.argv[1:]
for score in json.load(open(path)):
    print(f"| {direction} {split}: {score['name']} {score['score']}  {score['signature']}")
PY
    done
  fi
done
