#!/usr/bin/env bash
# Fine-tune a pretrained transducer (a NeMo .nemo or an asrkit experiment) on your data.
#
# Usage: recipes/finetune/run.sh (--nemo MODEL.nemo | --exp EXP) --data DIR [--work DIR]
#          [--memory SIZE] [--device GPU:0] [--tokenizer keep|new] [--vocab N]
#          [--parts TRAIN,DEV,TEST] [--config FILE] [--best N] [--lora RANK | --adapters DIM]
#          [--stage N] [--stop-stage M] [--set key=value]...
#   --data DIR   a LibriSpeech-layout corpus (--parts, default train-clean-100,dev-clean,
#                test-clean) or a directory holding train.jsonl, dev.jsonl and test.jsonl
#   --memory     plan the micro-batches for this device memory (e.g. 12GiB; asrkit plan)
#   --tokenizer  keep (default: the model's own, every weight is reused) or new (a tokenizer
#                of --vocab pieces trained on your transcripts: the output layers start fresh)
#   --config     training settings over the pretrained model's (default conf/finetune.yaml)
#   --lora RANK  train LoRA factors of this rank (model.adapters) instead of every weight;
#                with --tokenizer new the vocabulary's own weights train in full beside them
#   --adapters DIM  the same with NeMo's linear adapters of DIM units on every block
#                (either: at a learning rate of 1e-3, ten times full fine-tuning's)
#   0  import the .nemo (or take the experiment) as <work>/pretrained
#   1  manifests in <work>/data
#   2  tokenizer
#   3  audio shards (shards/train, shards/dev), read with the pretrained model's features
#   4  decode the dev and test sets with the pretrained model (WER before)
#   5  plan the micro-batches for --memory (skipped without it)
#   6  train --init-from the pretrained model
#   7  average the --best N checkpoints by dev WER (train.keep_best keeps them), decode the
#      dev and test sets (WER after), compare; warn when dev WER got worse
#   8  export a SavedModel of that average (<work>/exp/saved_model)
# Each finished stage leaves <work>/.done/<stage>; a rerun skips it (delete it to redo).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
stage=0; stop_stage=8; work=exp/finetune; nemo=; exp=; data=; memory=; device=
tokenizer=keep; vocab=256; parts=train-clean-100,dev-clean,test-clean; best=2
config="$here/conf/finetune.yaml"; sets=(); lora=; linear=
absolute() { [[ $1 == /* ]] && echo "$1" || echo "$PWD/$1"; }
while (( $# )); do
  case "$1" in
    --nemo) nemo=$(absolute "$2"); shift 2 ;;
    --exp) exp=$(absolute "$2"); shift 2 ;;
    --data) data=$(absolute "$2"); shift 2 ;;
    --work) work=$2; shift 2 ;;
    --memory) memory=$2; shift 2 ;;
    --device) device=$2; shift 2 ;;
    --tokenizer) tokenizer=$2; shift 2 ;;
    --vocab) vocab=$2; shift 2 ;;
    --parts) parts=$2; shift 2 ;;
    --config) config=$(absolute "$2"); shift 2 ;;
    --best) best=$2; shift 2 ;;
    --lora) lora=$2; shift 2 ;;
    --adapters) linear=$2; shift 2 ;;
    --stage) stage=$2; shift 2 ;;
    --stop-stage) stop_stage=$2; shift 2 ;;
    --set) sets+=(--set "$2"); shift 2 ;;
    -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done
fail() { echo "run.sh: $*" >&2; exit 2; }
[[ -n $nemo || -n $exp ]] || fail "give the pretrained model: --nemo MODEL.nemo or --exp EXP"
[[ -n $nemo && -n $exp ]] && fail "--nemo and --exp both given: choose one"
[[ -z $nemo || -f $nemo ]] || fail "--nemo $nemo: no such file"
[[ -z $exp || -f $exp/config.yaml ]] || fail "--exp $exp: not an asrkit experiment (no config.yaml)"
[[ -n $data ]] || fail "give the data: --data DIR (LibriSpeech layout or train/dev/test.jsonl)"
[[ -d $data ]] || fail "--data $data: no such directory"
[[ $tokenizer == keep || $tokenizer == new ]] || fail "--tokenizer $tokenizer: keep or new"
if [[ $tokenizer == new ]]; then
  # Fresh output layers do not learn at a same-language fine-tuning's 1e-4 in 5 epochs
  # (English to German: 100 % WER; at 1e-3 over 10 epochs 0-40 % by seed, RESULTS.md).
  # Before the user's --set, which overrides them.
  sets=(--set train.learning_rate=1.0e-3 --set train.epochs=10 --set train.warmup_updates=100
        "${sets[@]}")
fi
[[ -f $config ]] || fail "--config $config: no such file"
[[ $best =~ ^[1-9][0-9]*$ ]] || fail "--best $best: a number of checkpoints >= 1"
[[ -z $lora || $lora =~ ^[1-9][0-9]*$ ]] || fail "--lora $lora: a rank >= 1 (e.g. 8)"
[[ -z $linear || $linear =~ ^[1-9][0-9]*$ ]] || fail "--adapters $linear: a size >= 1 (e.g. 32)"
[[ -n $lora && -n $linear ]] && fail "--lora and --adapters both given: choose one"
IFS=, read -r -a split <<< "$parts"
(( ${#split[@]} == 3 )) || fail "--parts $parts: three parts, TRAIN,DEV,TEST"
asrkit=${ASRKIT:-asrkit}
caller=$PWD
mkdir -p "$work/.done"; cd "$work"
# shellcheck source=../lib/stages.sh
source "$here/../lib/stages.sh"

pretrained() {
  rm -rf pretrained
  if [[ -n $nemo ]]; then
    "$asrkit" import nemo "$nemo" --exp-dir pretrained
  else
    ln -s "$exp" pretrained  # decoded and fine-tuned from as it is, never written to
  fi
}
manifests() {
  mkdir -p data
  if [[ -f $data/train.jsonl ]]; then
    local name
    for name in train dev test; do
      [[ -f $data/$name.jsonl ]] || fail "--data $data: has train.jsonl but no $name.jsonl"
      # Relative audio paths resolved as asrkit resolves them: asrkit's `audio_path` from
      # where run.sh was started, NeMo's `audio_filepath` from the manifest's directory
      # when the file is there (as NeMo does), else from where run.sh was started.
      if python3 - "$data/$name.jsonl" "$caller" > "data/$name.jsonl.partial" <<'PY'
import json, os, sys
manifest, caller = sys.argv[1], sys.argv[2]
for number, line in enumerate(open(manifest, encoding="utf-8"), 1):
    if not line.strip():
        continue
    try:
        entry = json.loads(line)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        print(f"run.sh: {manifest} line {number}: not a JSON object", file=sys.stderr)
        sys.exit(2)
    key = "audio_filepath" if "audio_filepath" in entry else "audio_path"
    if isinstance(entry.get(key), str):  # the rest asrkit checks
        audio = entry[key]
        places = [audio] if os.path.isabs(audio) else [os.path.join(caller, audio)]
        if key == "audio_filepath" and not os.path.isabs(audio):
            places.insert(0, os.path.join(os.path.dirname(manifest), audio))
        found = next((place for place in places if os.path.isfile(place)), None)
        if found is None:
            print(f"run.sh: {manifest} line {number}: {key} {audio}: no such file (looked "
                  f"for {' and '.join(places)})", file=sys.stderr)
            sys.exit(2)
        entry[key] = os.path.abspath(found)
    print(json.dumps(entry, ensure_ascii=False))
PY
      then mv "data/$name.jsonl.partial" "data/$name.jsonl"
      else rm -f "data/$name.jsonl.partial"; exit 2
      fi
    done
  else
    # any language, case and punctuation: the tokenizer decides what it can encode
    "$asrkit" prepare librispeech --root "$data" --parts "$parts" --out data.librispeech \
      --any-text
    local i name
    for i in 0 1 2; do
      name=$(echo train dev test | cut -d' ' -f$((i + 1)))
      mv "data.librispeech/${split[$i]}.jsonl" "data/$name.jsonl"
    done
    rm -rf data.librispeech
  fi
}
make_tokenizer() {
  rm -rf tokenizer
  if [[ $tokenizer == keep ]]; then
    cp -r pretrained/tokenizer tokenizer
  else
    local cased=()  # a cased pretrained model gets a cased new tokenizer
    grep -q '"lower_case": false' pretrained/tokenizer/tokenizer.json && cased=(--keep-case)
    "$asrkit" tokenizer train --manifest data/train.jsonl --vocab-size "$vocab" \
      --model-type unigram --out tokenizer "${cased[@]}"
  fi
}
features() {
  local name
  for name in train dev; do  # the test set is decoded from its manifest, by each model
    local scored=(); [[ $name == dev ]] && scored=(--allow-unknown)
    "$asrkit" features extract --manifest "data/$name.jsonl" --tokenizer tokenizer \
      --out "shards/$name" --shards 4 --store audio --config pretrained/config.yaml "${scored[@]}"
  done
}
finetune_config() {  # the pretrained model's config, the fine-tuning settings, the data
  {
    echo "base: pretrained/config.yaml"
    grep -v '^base:' "$config"
  } > finetune.yaml
}
data_sets() {  # the fine-tuning data; an asrkit experiment's own CMVN statistics stay
  local cmvn=null; [[ -f pretrained/cmvn.json ]] && cmvn=pretrained/cmvn.json
  echo --set data.train_shards=shards/train --set data.dev_shards=shards/dev \
    --set data.tokenizer=tokenizer --set data.cmvn=$cmvn --set data.plan=null
}
adapter_sets() {  # --lora/--adapters: the adapters, and a new vocabulary's weights in full
  if [[ -n $lora ]]; then
    echo --set model.adapters.kind=lora --set "model.adapters.rank=$lora"
  elif [[ -n $linear ]]; then
    echo --set model.adapters.kind=linear --set "model.adapters.dim=$linear"
  else
    return 0
  fi
  # Adapters start at zero and are few: ten times full fine-tuning's rate (RESULTS.md,
  # "Adapting": on unseen voices 1e-3 took LoRA from 43.7 to 41.7 % test WER, full 41.3 %).
  # A --set train.learning_rate given to the recipe comes after this and wins.
  echo --set train.learning_rate=1.0e-3
  if [[ $tokenizer == new ]]; then
    local full=joint.output_layer,predictor.embedding
    grep -q 'ctc_head: true' pretrained/config.yaml && full=$full,ctc_head
    echo --set "train.trainable=[$full]"
  fi
}
wer() { grep -h "WER" "$1/report.txt" | head -n 1; }
wer_percent() {
  python3 -c 'import json, sys; print("%.2f" % (100 * json.load(open(sys.argv[1]))["wer"]))' \
    "$1/wer.json"
}
before() {
  local name
  for name in dev test; do
    "$asrkit" decode --exp-dir pretrained --manifest "data/$name.jsonl" --method greedy \
      --out "decode_before/$name"
    log "before fine-tuning, $name: $(wer "decode_before/$name")"
  done
}
plan() {
  finetune_config
  local on=(); [[ -n $device ]] && on=(--device "$device")
  # shellcheck disable=SC2046
  "$asrkit" plan --config finetune.yaml --exp-dir exp --memory "$memory" "${on[@]}" \
    $(data_sets) $(adapter_sets) "${sets[@]}"
}
train() {
  finetune_config
  local planned=(); [[ -f exp/plan.json ]] && planned=(--plan exp/plan.json)
  # shellcheck disable=SC2046
  "$asrkit" train --config finetune.yaml --exp-dir exp --init-from pretrained "${planned[@]}" \
    $(data_sets) $(adapter_sets) "${sets[@]}"
}
best_average() {  # the --best checkpoints by dev WER (fewer if fewer epochs have one)
  local have
  have=$(grep -l '"dev_wer": [0-9]' exp/checkpoints/ckpt-*[0-9]/state.json 2>/dev/null | wc -l)
  (( have > 0 )) || fail "exp/checkpoints: no checkpoint has a dev WER (no dev set?)"
  rm -rf exp/best
  "$asrkit" average --exp-dir exp --best $(( have < best ? have : best )) --out exp/best
}
after() {
  best_average
  local name
  for name in dev test; do
    "$asrkit" decode --exp-dir exp --checkpoint exp/best --manifest "data/$name.jsonl" \
      --method greedy --out "exp/decode_after/$name"
  done
  for name in dev test; do
    log "$name WER before fine-tuning: $(wer "decode_before/$name")"
    log "$name WER after fine-tuning:  $(wer "exp/decode_after/$name")"
  done
  local was now
  was=$(wer_percent decode_before/dev); now=$(wer_percent exp/decode_after/dev)
  if python3 -c 'import sys; sys.exit(not float(sys.argv[2]) > float(sys.argv[1]))' \
    "$was" "$now"; then
    log "warning: fine-tuning made dev WER worse ($was % -> $now %): try a lower" \
      "train.learning_rate, fewer train.epochs or train.freeze_encoder, or keep the" \
      "pretrained model"
  fi
}
export_model() {
  "$asrkit" export --exp-dir exp --checkpoint exp/best --out exp/saved_model --force
}

run_stage 0 pretrained pretrained
run_stage 1 manifests manifests
run_stage 2 tokenizer make_tokenizer
run_stage 3 features features
run_stage 4 before before
if [[ -n $memory ]]; then run_stage 5 plan plan; fi
run_stage 6 train train
run_stage 7 after after
run_stage 8 export export_model
