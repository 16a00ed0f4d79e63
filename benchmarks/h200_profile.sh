#!/usr/bin/env bash
# On the GPU machine (one H200): measure the shipped profile and prove its error.
#   bash benchmarks/h200_profile.sh [DEST] [profile] [validate] [suite]     (default: all three)
#   profile  - calibrate the Llama-3-8B shape (random bf16 weights) over the full grid
#              -> DEST/h200-llama3-8b.json (+ .points.jsonl, .fit.png); rerunning resumes;
#   validate - the hold-out workload scenarios/validate_h200.yaml -> DEST/validation_h200/
#              (validation.json, validation.txt, cdf_*.png);
#   suite    - 3 loads x static / continuous / chunked prefill -> DEST/validation_h200/
#              (validate_suite.json, validate_suite.txt); SUITE_ARGS passes e.g. "--requests 200".
# DEST defaults to profiles/ (the profile) and benchmarks/results/ (the reports); on a lent
# machine pass $OUT, the folder that comes back, and copy the files into place here.
# PROFILE=path reads (and writes) the profile there instead, e.g. a suite-only call after
# the profile was copied into profiles/.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=".:${PYTHONPATH:-}"
DEST=${1:-}
shift || true
STEPS=${*:-profile validate suite}
PROFILE=${PROFILE:-${DEST:-profiles}/h200-llama3-8b.json}
REPORTS=${DEST:-benchmarks/results}/validation_h200
mkdir -p "$(dirname "$PROFILE")" "$REPORTS"
for step in $STEPS; do
  case $step in
    # python -m calibrate: the cbsim commands without typer/rich (the lent GPU image lacks them).
    profile) $PY -m calibrate profile --model llama3-8b --hardware-name h200 --out "$PROFILE" ;;
    validate) $PY -m calibrate validate scenarios/validate_h200.yaml --profile "$PROFILE" --out "$REPORTS" \
                | tee "$REPORTS/validation.txt" ;;
    suite) $PY benchmarks/validate_suite.py --size h200 --profile "$PROFILE" --out "$REPORTS" ${SUITE_ARGS:-} \
             | tee "$REPORTS/validate_suite.txt" ;;
    *) echo "unknown step '$step' (profile, validate, suite)" >&2; exit 2 ;;
  esac
done
