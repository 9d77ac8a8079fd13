#!/usr/bin/env bash
# LibriSpeech: a Conformer transducer with the paper-sized effective batch on one small GPU.
#
# Usage: recipes/librispeech/train.sh --data DIR [--work DIR] [--stage N] [--stop-stage M]
#          [--config FILE] [--micro-batch-seconds S | --memory SIZE] [--set key=value]...
#          [--train-parts a,b,c] [--eval-parts a,b] [--dev-part NAME] [--vocab N]
#          [--speeds 0.9,1.0,1.1] [--train-shards 64] [--average N]
#   --data  a directory holding the parts, extracted (DIR/LibriSpeech/<part> or DIR/<part>)
#           or as the official archives (DIR/<part>.tar.gz, extracted in stage 0). Nothing is
#           ever downloaded.
#   0  check the layout (extract archives that are not extracted yet)
#   1  prepare JSONL manifests (every utterance validated; problems listed by id)
#   2  SentencePiece unigram tokenizer on the training text (--vocab, 1024 by default)
#   3  audio shards (the FLAC in TFRecords; log-mel computed while training reads them, one
#      of --speeds drawn per utterance per epoch), a third of the training utterances
#      joined with the next ones up to 30 s; + CMVN
#   4  train (conf/conformer_s.yaml by default; --micro-batch-seconds fits the GPU, or
#      --memory 12GiB first measures a per-bucket plan on the GPU (asrkit plan); the
#      config's effective_batch_seconds fixes the update size: accumulation makes up the rest)
#   5  average the last --average checkpoints; decode every --eval-parts part, greedy and
#      beam 4, and score
#   6  export a waveform -> text SavedModel and transcribe one test file with it
# Each finished stage leaves <work>/.done/<stage>; a rerun skips it (delete it to redo).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
data=""; work=exp/librispeech; stage=0; stop_stage=6; config="$here/conf/conformer_s.yaml"
train_parts=train-clean-100,train-clean-360,train-other-500
eval_parts=dev-clean,dev-other,test-clean,test-other
dev_part=dev-clean; vocab=1024; speeds=0.9,1.0,1.1; average=10; train_shards=64; sets=()
memory=""
while (( $# )); do
  case "$1" in
    --data) data=$(cd "$2" && pwd); shift 2 ;;
    --work) work=$2; shift 2 ;;
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --config) config=$(cd "$(dirname "$2")" && pwd)/$(basename "$2"); shift 2 ;;
    --micro-batch-seconds) sets+=(--set "data.batch_seconds=$2"); shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    --train-parts) train_parts=$2; shift 2 ;;
    --eval-parts) eval_parts=$2; shift 2 ;;
    --dev-part) dev_part=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --speeds) speeds=$2; shift 2 ;;
    --train-shards) train_shards=$2; shift 2 ;;
    --average) average=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n $data ]] || { echo "--data DIR is required (see --help)" >&2; exit 2; }
asrkit=${ASRKIT:-asrkit}
mkdir -p "$work/.done"; cd "$work"
# shellcheck source=../lib/stages.sh
source "$here/../lib/stages.sh"
IFS=, read -r -a train_list <<< "$train_parts"
IFS=, read -r -a eval_list <<< "$eval_parts"
scored=("${eval_list[@]}")
[[ " ${eval_list[*]} " == *" $dev_part "* ]] || scored+=("$dev_part")
all_parts=("${train_list[@]}" "${scored[@]}")

check_layout() {  # links every part into corpus/, extracting official archives if needed
  mkdir -p corpus
  local part missing=()
  for part in "${all_parts[@]}"; do
    if [[ ! -d $data/LibriSpeech/$part && ! -d $data/$part && -f $data/$part.tar.gz ]]; then
      log "extracting $data/$part.tar.gz"
      tar -xzf "$data/$part.tar.gz" -C "$data"
    fi
    if [[ -d $data/LibriSpeech/$part ]]; then ln -sfn "$data/LibriSpeech/$part" "corpus/$part"
    elif [[ -d $data/$part ]]; then ln -sfn "$data/$part" "corpus/$part"
    else missing+=("$part"); fi
  done
  if (( ${#missing[@]} )); then
    echo "missing under $data: ${missing[*]} (need DIR/LibriSpeech/<part>, DIR/<part> or" \
      "DIR/<part>.tar.gz; this recipe never downloads; choose parts with --train-parts," \
      "--eval-parts, --dev-part)" >&2
    return 1
  fi
  log "parts: ${all_parts[*]}"
}
prepare() {
  local joined; joined=$(IFS=,; echo "${all_parts[*]}")
  "$asrkit" prepare librispeech --root corpus --parts "$joined" --out data
  local part; : > data/train.jsonl.tmp
  for part in "${train_list[@]}"; do cat "data/$part.jsonl" >> data/train.jsonl.tmp; done
  mv data/train.jsonl.tmp data/train.jsonl
}
features() {
  # A third of the utterances start a run of the chapter's next ones joined up to 30 s (no
  # longer than LibriSpeech's own longest) with pauses of up to 1 s, so the model goes on
  # past a sentence end and across a pause.
  "$asrkit" features extract --manifest data/train.jsonl --tokenizer tokenizer --store audio \
    --out shards/train --shards "$train_shards" --speeds "$speeds" --workers "$(nproc)" \
    --join-seconds 30 --join-share 0.3 --join-pause 1 --config "$config" "${sets[@]}"
  local part
  for part in "${scored[@]}"; do
    "$asrkit" features extract --manifest "data/$part.jsonl" --tokenizer tokenizer --store audio \
      --out "shards/$part" --shards 8 --workers "$(nproc)" --config "$config" "${sets[@]}" \
      --allow-unknown  # only scored
  done
  "$asrkit" features cmvn --shards shards/train --out cmvn.json --config "$config" "${sets[@]}"
}
train() {
  local data_sets=(--set data.train_shards=shards/train --set "data.dev_shards=shards/$dev_part"
                   --set data.tokenizer=tokenizer --set data.cmvn=cmvn.json)
  local plan=()
  if [[ -n $memory ]]; then
    [[ -f exp/plan.json ]] || "$asrkit" plan --config "$config" --exp-dir exp --memory "$memory" \
      "${data_sets[@]}" "${sets[@]}"
    plan=(--plan exp/plan.json)
  fi
  "$asrkit" train --config "$config" --exp-dir exp "${data_sets[@]}" "${sets[@]}" "${plan[@]}"
}
decode() {
  "$asrkit" average --exp-dir exp --last "$average" --out exp/averaged
  local part method
  for part in "${eval_list[@]}"; do
    for method in greedy beam; do
      "$asrkit" decode --exp-dir exp --checkpoint exp/averaged --shards "shards/$part" \
        --method "$method" --beam 4 --out "exp/decode/$part-$method"
    done
  done
}
export_model() {
  # The emission delay (word times say when words begin), measured on the dev part's onsets.
  "$asrkit" calibrate --exp-dir exp --checkpoint exp/averaged --manifest "data/$dev_part.jsonl" \
    --method beam --beam 4 || echo "word times stay uncalibrated (see the error above)"
  "$asrkit" export --exp-dir exp --checkpoint exp/averaged --out exp/export
  local audio; audio=$(find -L "corpus/${eval_list[-1]}" -name '*.flac' | sort | head -n 1)
  "$asrkit" transcribe --model exp/export "$audio"
}

run_stage 0 layout check_layout
run_stage 1 prepare prepare
run_stage 2 tokenizer "$asrkit" tokenizer train --manifest data/train.jsonl \
  --vocab-size "$vocab" --model-type unigram --out tokenizer
run_stage 3 features features
run_stage 4 train train
run_stage 5 decode decode
run_stage 6 export export_model
log "results:"; cat exp/decode/*/report.txt 2>/dev/null | grep -E "WER" || true
