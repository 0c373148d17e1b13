#!/usr/bin/env bash
# The measured runs behind README "Performance", in order; results in $OUT (default
# benchmarks/results). THREADS is the model's thread count for every system (pagedserve worker,
# in-process engine, HF generate, transformers serve). Run on an otherwise idle machine; ~45 min
# on 2 cores.
#   ISA=avx2   run every system as on an AVX2-only CPU (no AVX-512, no native bf16: float32)
#   ONLY=tf    only step 4, pagedserve vs `transformers serve --continuous-batching` and HF
#              generate (~15 min on 2 cores with the default 48 prompts; TF_PROMPTS=16 for ~5;
#              a level or HF run during which the hypervisor stole > 10% of the CPU is measured
#              again, up to 3 times: benchmarks/steal_guard.py)
#   ROUNDS=N   alternate pagedserve and transformers serve N times; each level reports each
#              server's median round (benchmarks/server_rounds.py; N x ~8 min in AVX2 fp32)
#   VLLM_PYTHON=/path/to/vllm-venv/bin/python
#              also step 5: against vLLM's CPU build, the same workload at 16 and 64 in flight
#              and a Poisson request-rate sweep (RATES, default 0.5,1,2), ROUNDS alternated
#              rounds, medians over the rounds without steal, rate plots (benchmarks/vs_vllm.py)
#   ONLY=vllm  only step 5
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results}
THREADS=${THREADS:-1}
PY=${PY:-.venv/bin/python}
if [[ "${ISA:-}" == "avx2" ]]; then
  # one cap per library that picks its kernels at run time (see benchmarks/machine_info.py)
  export ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
fi
WORKLOAD=(--num-prompts "${PROMPTS:-192}" --seed 0 --prompt-len 64 --prompt-len-sigma 0.8
          --output-len 48 --output-len-sigma 1.0)
if [[ "${ONLY:-}" == "vllm" && -z "${VLLM_PYTHON:-}" ]]; then
  echo "ONLY=vllm needs VLLM_PYTHON (the python of the venv vLLM's CPU build is in)" >&2
  exit 2
fi
mkdir -p "$OUT"
uptime | tee "$OUT/load.txt"
if [[ -z "${ONLY:-}" ]]; then
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
fi
if [[ "${ONLY:-}" != "vllm" ]]; then
# 4. against transformers serve --continuous-batching and HF generate: same workload, client and
#    run, TTFT / TPOT at 16 and 64 in flight, % of the FLOP limit, greedy texts compared
$PY -m benchmarks.vs_transformers_serve --num-prompts "${TF_PROMPTS:-48}" --seed 0 \
  --threads "$THREADS" --concurrency 16,64 --num-check "${TF_CHECK:-16}" --hf-batch-sizes 16 \
  ${SPEC_TOKENS:+--num-speculative-tokens "$SPEC_TOKENS"} --speculative-max-num-seqs "${SPEC_MAX_SEQS:-32}" \
  --rounds "${ROUNDS:-1}" --out "$OUT/vs_transformers_serve"
uptime | tee -a "$OUT/load.txt"
fi
# 5. against vLLM's CPU build, where its venv is given: fixed concurrency and a rate sweep
if [[ -n "${VLLM_PYTHON:-}" && "${ONLY:-}" != "tf" ]]; then
  $PY -m benchmarks.vs_vllm --vllm-python "$VLLM_PYTHON" --num-prompts "${TF_PROMPTS:-48}" \
    --seed 0 --threads "$THREADS" --concurrency 16,64 --rates "${RATES:-0.5,1,2}" \
    --rounds "${ROUNDS:-1}" --out "$OUT/vs_vllm"
  uptime | tee -a "$OUT/load.txt"
fi
$PY -m benchmarks.report_writer --dir "$OUT" > "$OUT/performance.md"
