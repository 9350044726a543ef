#!/usr/bin/env bash
# The one command for a lent GPU window, from the repository root of the device's copy:
#   bash scripts/gpu_window.sh [scripts/gpu_window.py flags, e.g. --deadline_s 570]
# Prepares the machine (scripts/device_env.sh: carried wheels, JAX's environment with the
# persistent compilation cache in /tmp/xla_cache), then scripts/gpu_window.py measures
# the tiny recipe's launch to step 8,000, 8 seeds together against one, what a save holds
# the loop up, the tiny step's profile, and the base model in bf16 against PyTorch
# (bench/gpu_peer.py), and spends what is left of the deadline on the sweep plan (--plan).
# What comes back is $OUT/gpu_window.tgz.part00, 01.. of results/: bench/gpu_*.json (each
# names the device), runs/ (the measured runs' metrics.jsonl), sweep/ (scripts/sweep.py's
# folder), logs/. A call is at most 600 s: the default deadline, 570 s, leaves room to
# hand back.
set -u
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source "$(dirname "$0")/device_env.sh" || exit 1
python3 scripts/gpu_window.py "$@"
code=$?
# A lent machine hands back at most 8 files of 16 MiB, 2 folders down: everything under
# $OUT/results goes back as one archive in 15 MiB parts (here: cat gpu_window.tgz.part* | tar xz).
if [ -d "$OUT/results" ]; then
  tar czf - -C "$OUT" results | split -b 15M -d - "$OUT/gpu_window.tgz.part" && rm -rf "$OUT/results"
fi
exit $code
