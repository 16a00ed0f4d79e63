#!/usr/bin/env bash
# Build .whl/, the wheelhouse that lets cbsim run on the lent H200 (no registry there).
# The device image (python 3.12, torch 2.11 + CUDA 13, triton 3.6, numpy, pandas, scipy, pyyaml,
# matplotlib, ...) lacks simpy and pydantic; these are their wheels, pinned, for cp312 x86-64.
# Run once here, in the repo root; .whl/ is ignored by git and travels with `carry: [".whl"]`.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo /.whl/ >> .git/info/exclude; }
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  simpy==4.1.2 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
  typing-inspection==0.4.5 typing_extensions==4.16.0
ls -la .whl
