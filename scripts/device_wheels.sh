#!/usr/bin/env bash
# Here, before a lent GPU window: downloads into .whl/ the wheels the lent machines' image
# lacks (it cannot reach a package registry), for scripts/device_env.sh to install there.
# Name `.whl` in the device call's carry. Idempotent: pip skips the wheels already present.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .gitignore || { echo "error: .whl/ is not ignored by git" >&2; exit 1; }
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 -d .whl \
  ml_collections==1.1.0 sacremoses==0.2.0 tensorboardX==2.6.5
ls .whl
