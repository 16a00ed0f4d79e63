#!/usr/bin/env bash
# One command on the GPU machine (one H200): measure the shipped profile and prove its error.
#   1. calibrate the Llama-3-8B shape (random bf16 weights) over the full grid
#      -> profiles/h200-llama3-8b.json (+ .points.jsonl, .fit.png); rerunning resumes;
#   2. validate it on the hold-out workload (scenarios/validate_h200.yaml);
#   3. the validation suite: 3 loads x static / continuous / chunked prefill.
# Results (validation.json, CDF plots, validate_suite.json/.txt) in benchmarks/results/validation_h200/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=benchmarks/results/validation_h200
PROFILE=profiles/h200-llama3-8b.json
mkdir -p "$OUT"
export PYTHONPATH=".:${PYTHONPATH:-}"
# python -m calibrate: the cbsim commands without typer/rich (the lent GPU image lacks them).
$PY -m calibrate profile --model llama3-8b --hardware-name h200 --out "$PROFILE"
$PY -m calibrate validate scenarios/validate_h200.yaml --profile "$PROFILE" --out "$OUT" \
    | tee "$OUT/validation.txt"
$PY benchmarks/validate_suite.py --size h200 --profile "$PROFILE" --out "$OUT" ${SUITE_ARGS:-} \
    | tee "$OUT/validate_suite.txt"
