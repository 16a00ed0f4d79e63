#!/usr/bin/env bash
# One command on the GPU machine (one H200): measure the shipped profile and prove its error.
#   1. calibrate the Llama-3-8B shape (random bf16 weights) over the full grid
#      -> profiles/h200-llama3-8b.json (+ .points.jsonl, .fit.png); rerunning resumes;
#   2. validate it on the hold-out workload (scenarios/validate_h200.yaml);
#   3. the validation suite: 3 loads x static / continuous / chunked prefill.
# Results (validation.json, CDF plots, validate_suite.json/.txt) in benchmarks/results/validation_h200/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
OUT=benchmarks/results/validation_h200
PROFILE=profiles/h200-llama3-8b.json
mkdir -p "$OUT"
export PYTHONPATH=${PYTHONPATH:-.}
$PY -m sim.cli calibrate --model llama3-8b --hardware-name h200 --out "$PROFILE"
$PY -m sim.cli validate scenarios/validate_h200.yaml --profile "$PROFILE" --out "$OUT" \
    | tee "$OUT/validation.txt"
$PY benchmarks/validate_suite.py --size h200 --profile "$PROFILE" --out "$OUT" ${SUITE_ARGS:-} \
    | tee "$OUT/validate_suite.txt"
