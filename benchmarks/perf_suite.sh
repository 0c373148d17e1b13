#!/usr/bin/env bash
# The measured runs behind README "Performance", in order; results in $OUT (default
# benchmarks/results). THREADS is the model's thread count for every system (pagedserve worker,
# in-process engine, HF generate). Run on an otherwise idle machine; ~30 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
THREADS=${THREADS:-1}
PY=${PY:-.venv/bin/python}
WORKLOAD=(--num-prompts "${PROMPTS:-192}" --seed 0 --prompt-len 64 --prompt-len-sigma 0.8
          --output-len 48 --output-len-sigma 1.0)
mkdir -p "$OUT"
uptime | tee "$OUT/load.txt"
# 1. end to end through gateway + Redis + scheduler + worker, then HF generate on the same requests
$PY -m benchmarks.serve --launch --worker-threads "$THREADS" "${WORKLOAD[@]}" \
  --prompt-len-range 8,512 --output-len-range 4,384 --concurrency-sweep 16,32,64,128 \
  --hf-baseline --hf-batch-sizes 16,32,64 --hf-threads "$THREADS" --out "$OUT/serve"
uptime | tee -a "$OUT/load.txt"
# 2. the same workload in-process (before and after) vs through the services; KV report
$PY -m benchmarks.pipeline_overhead "${WORKLOAD[@]}" --prompt-len-max 512 --output-len-max 384 \
  --threads "$THREADS" --worker-threads "$THREADS" --out "$OUT/pipeline_overhead"
uptime | tee -a "$OUT/load.txt"
# 3. decode throughput vs the FLOP limit, matmul rate measured in the same process
$PY -m benchmarks.roofline --threads "$THREADS" --batch-sizes "${ROOF_BATCHES:-16,64,128,256}" \
  --out "$OUT/roofline.json"
uptime | tee -a "$OUT/load.txt"
$PY -m benchmarks.report_writer --dir "$OUT" > "$OUT/performance.md"
