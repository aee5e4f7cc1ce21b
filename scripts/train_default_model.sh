#!/usr/bin/env bash
# Rebuild Solo's bundled default model, solo/assets/solo-code-16m, from scratch.
#
# This is the exact command that produced the shipped folder (there, --device auto found a CUDA
# GPU and the 3000 steps took about a minute). It trains on the Python sources of the running
# interpreter's standard library, so the corpus (and the weights) depend on the Python install;
# the model card records the version and a hash of the file list.
#
# Checkpoints, caches and the training log go to runs/solo-code-16m/. An interrupted run continues
# with:   scripts/train_default_model.sh --resume
# Training stops at 3000 steps or after 60 minutes of training, whichever comes first, and the
# learning-rate schedule follows whichever is closer to running out. On a GPU (picked by
# --device auto) the 3000 steps finish well inside the budget. Set PYTHON to choose the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p runs
exec "${PYTHON:-python3}" -m solo.train \
    --out solo/assets/solo-code-16m \
    --run-dir runs/solo-code-16m \
    --size default \
    --seed 1234 \
    --steps 3000 \
    --time-budget-min 60 \
    --compile \
    --threads 2 \
    --device auto \
    --overwrite \
    "$@"
