#!/usr/bin/env bash
# One lent-GPU call that finishes what fits and hands the rest back to the CPU:
#   bash scripts/split_runs.sh PLAN TRAIN_END_S EVAL_END_S
# PLAN lines: NAME STOP CONFIG [--config.x=y ...] ('#' lines skipped). Each run trains in
# runs/gpu/NAME (carry a resumed run's latest checkpoint there) up to train.num_steps=STOP,
# all runs at once, SIGTERM (which saves) at TRAIN_END_S seconds after the start.
#   * A run that reached its config's own num_steps (STOP = "full") is evaluated here
#     (valid, beam 5, last-10 average, lp ${LPS}); its eval JSONs come back in runs.tgz.
#   * Any other run comes back as its newest checkpoint, tokenizer and config
#     (model_<name>.tgz.part*), for `train.py` to resume on the CPU with the recipe's own
#     command. STOP <= num_steps - 1000 keeps the last-10 average's window (100 steps
#     apart) on the CPU side. Only ~2 checkpoints (26 MiB each) fit what comes back.
set -u
PLAN=$1; TRAIN_END=$2; EVAL_END=$3
OUTDIR=${OUT:-/tmp/out}; mkdir -p "$OUTDIR" logs
source "$(dirname "$0")/device_env.sh"
T0=$(date +%s)
declare -A STOPS
while read -r name stop config rest; do
  [[ -z "$name" || "$name" == \#* ]] && continue
  STOPS[$name]=$stop
  mkdir -p "$(dirname "logs/$name")" "runs/gpu/$name"
  steps=(); [ "$stop" != full ] && steps=(--config.train.num_steps="$stop")
  left=$(( T0 + TRAIN_END - $(date +%s) )); [ "$left" -lt 1 ] && left=1  # timeout 0 = none
  # shellcheck disable=SC2086
  ( timeout -s TERM "$left" python3 train.py --config "$config" \
      --workdir "runs/gpu/$name" $rest "${steps[@]}" > "logs/$name.train.log" 2>&1
    echo "$name: train exit $? at $(( $(date +%s) - T0 )) s"
    last=$(ls "runs/gpu/$name/checkpoints" 2>/dev/null | grep -E '^[0-9]+$' | sort -n | tail -1)
    if [ "$stop" = full ]; then
      for lp in ${LPS:-1.25 1.0}; do
        left=$(( T0 + EVAL_END - $(date +%s) )); [ "$left" -lt 10 ] && break
        timeout "$left" python3 evaluate.py --workdir "runs/gpu/$name" --split valid --beam_size 5 \
          --average_last 10 --checkpoint last --compat_lc_tok --length_penalty "$lp" \
          --name "valid_avg10_beam5_lp$lp" > "logs/$name.eval_valid_lp$lp.log" 2>&1 &
      done; wait
      echo "$name: evaluated at $(( $(date +%s) - T0 )) s"
    elif [ -n "$last" ]; then
      d=runs/gpu/$name
      tar cf - "$d/config.json" "$d/tokenizer" "$d/metrics.jsonl" "$d/checkpoints/$last" \
        | gzip -1 | split -b 15M - "$OUTDIR/model_${name//\//_}.tgz.part"
      echo "$name: packed step $last at $(( $(date +%s) - T0 )) s"
    fi ) &
done < "$PLAN"
wait
for name in "${!STOPS[@]}"; do
  grep -h '"split": "valid"' "runs/gpu/$name/metrics.jsonl" 2>/dev/null | tail -1
  for f in runs/gpu/"$name"/eval/*.json; do [ -f "$f" ] && python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print(sys.argv[1], round(d['bleu'],2), round(d['bleu_lc_tok'],2), round(d['chrf'],2))" "$f"; done
done
tar czf "$OUTDIR/runs.tgz" logs runs/gpu/*/*/config.json runs/gpu/*/*/metrics.jsonl runs/gpu/*/*/eval 2>/dev/null
ls -la "$OUTDIR"; echo "done at $(( $(date +%s) - T0 )) s"
