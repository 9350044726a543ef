#!/usr/bin/env bash
# GPU sweep driver: bash scripts/sweep.sh PLAN TRAIN_TIMEOUT_S DEADLINE_S (evals stop at T0+DEADLINE_S)
# PLAN lines: NAME CONFIG [--config.x=y ...]; '#' lines are skipped.
set -u
PLAN=$1; TRAIN_T=$2; EVAL_T=${3:-200}
OUTDIR=${OUT:-/tmp/out}; mkdir -p "$OUTDIR" logs runs
source "$(dirname "$0")/device_env.sh"
T0=$(date +%s)
names=()
while read -r name config rest; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  names+=("$name")
  mkdir -p "$(dirname "logs/$name")"  # a NAME like en_de_seeds/seed1 (train.py --seeds' layout)
  # shellcheck disable=SC2086
  timeout -s INT "$TRAIN_T" python3 train.py --config "$config" --workdir "runs/$name" $rest > "logs/$name.train.log" 2>&1 &
done < "$PLAN"
wait
echo "training done after $(( $(date +%s) - T0 )) s"
for name in "${names[@]}"; do
  for split in valid test; do ( for lp in ${LPS:-0.6 1.0}; do
      left=$(( T0 + EVAL_T - $(date +%s) )); [ $left -lt 5 ] && break
      timeout "$left" python3 evaluate.py --workdir "runs/$name" --split $split --beam_size 5 \
        --average_last 10 --checkpoint last --compat_lc_tok --batch_size 256 --length_penalty $lp \
        --name "${split}_avg10_beam5_lp$lp" > "logs/$name.eval_${split}_lp$lp.log" 2>&1
    done ) & done
done
wait
echo "eval done after $(( $(date +%s) - T0 )) s"
for name in "${names[@]}"; do
  last=$(grep '"split": "valid"' "runs/$name/metrics.jsonl" 2>/dev/null | tail -1 | python3 -c "import sys,json; l=sys.stdin.read().strip(); d=json.loads(l) if l else {}; print(d.get('step'), round(d.get('bleu',0),2))")
  tr=$(grep '"split": "train"' "runs/$name/metrics.jsonl" 2>/dev/null | tail -1 | python3 -c "import sys,json; l=sys.stdin.read().strip(); d=json.loads(l) if l else {}; print(d.get('step'), round(d.get('tokens_per_sec',0)))")
  v=$(for lp in ${LPS:-0.6 1.0}; do python3 -c "import json; d=json.load(open('runs/$name/eval/valid_avg10_beam5_lp$lp.json')); print('lp$lp', round(d['bleu'],2), round(d['bleu_lc_tok'],2), end=' ')" 2>/dev/null; done)
  echo "$name  valid-greedy(step,bleu)=$last  train(step,tok/s)=$tr  valid-avg10-beam5(cased,lc-tok)=$v"
done
tar czf "$OUTDIR/runs.tgz" logs runs/*/config.json runs/*/metrics.jsonl runs/*/eval \
  runs/*/*/config.json runs/*/*/metrics.jsonl runs/*/*/eval 2>/dev/null
if [ -n "${PACK:-}" ] && [ -d "runs/$PACK/checkpoints" ]; then
  last=$(ls runs/$PACK/checkpoints | grep -E '^[0-9]+$' | sort -n | tail -1)
  tar cf - runs/$PACK/config.json runs/$PACK/tokenizer runs/$PACK/metrics.jsonl runs/$PACK/checkpoints/$last runs/$PACK/attention | gzip -1 | split -b 15M - "$OUTDIR/model_$PACK.tgz.part"
fi
if [ -n "${BENCH:-}" ]; then
  for spec in $BENCH; do  # size:dtype
    size=${spec%%:*}; dtype=${spec##*:}
    left=$(( T0 + ${BENCH_END:-590} - $(date +%s) )); [ $left -lt 20 ] && break
    timeout $left python3 bench/train_throughput.py --size $size --dtype $dtype --steps 20 --warmup 3 --peak_sizes 2048,4096,8192 \
      --json "$OUTDIR/gpu_train_${size}_${dtype}.json" 2>&1 | tail -25
  done
fi
ls -la "$OUTDIR"
