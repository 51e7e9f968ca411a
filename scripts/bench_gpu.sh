#!/usr/bin/env bash
# The GPU measurements of docs/studies/performance/ (its chronology.md), in parts that each fit a 10-minute slot:
#
#   bash scripts/bench_gpu.sh train OUT_DIR   # environment, 125M train step, decode at 8k context
#   bash scripts/bench_gpu.sh rest OUT_DIR    # cuDNN attention: train step, tests, profile; fast tier
#   bash scripts/bench_gpu.sh decode OUT_DIR  # decode at 8k/32k, ops per step, 12 heads to 4 KV heads
#   bash scripts/bench_gpu.sh flash OUT_DIR   # the fused decode kernel: its tests, then decoding
#                                             # at 8k with it and with XLA's attention, same run
#   bash scripts/bench_gpu.sh batch64 OUT_DIR # the fused kernel at batch 32 and 64 (8k), then the
#                                             # 125M cuDNN step with XLA's Triton GEMMs and without,
#                                             # and its profile
#   bash scripts/bench_gpu.sh cublas OUT_DIR  # Triton GEMMs off as a per-compile option, A/B in
#                                             # one process; the profile with them off (env flag)
#   bash scripts/bench_gpu.sh logits OUT_DIR  # the 125M step: Triton GEMMs off per compile, then
#                                             # bfloat16 logits against float32 (Triton off), each
#                                             # an A/B in one process
#   bash scripts/bench_gpu.sh roofline OUT_DIR [SECONDS]
#                                             # the fused kernels' tests compiled (MLA's latent
#                                             # kernel too); decoding with them at 8k (batch 8, 64)
#                                             # and 32k (batch 1, 8) against the copy-bandwidth
#                                             # reference; the 125M step against compiled and eager
#                                             # nanoGPT. Steps that no longer fit SECONDS
#                                             # (default 570) are skipped, said in the log
#   bash scripts/bench_gpu.sh next OUT_DIR    # after 2026-11-29 (kernels concatenated once per
#                                             # decode call; the loss's one-pass backward): the
#                                             # roofline decode table (8k: batch 8, 64; 32k: 1, 8),
#                                             # then the 125M step of MHA and GQA-4 against
#                                             # compiled and eager nanoGPT
#   bash scripts/bench_gpu.sh next2 OUT_DIR   # then decoding A/Bs: at 32k with the whole loop in
#                                             # CUDA graphs (XLA command buffers for WHILE), at
#                                             # 8k with cuBLAS for the weight GEMMs (Triton off);
#                                             # MQA's and GQA-4's decode profile at 8k / 64
#   bash scripts/bench_gpu.sh next3 OUT_DIR   # then the 125M MLA step, and the MHA step's profile
#   bash scripts/bench_gpu.sh studies OUT_DIR # the kv_contrast study's sweep as seed ensembles
#                                             # (as published, then at d_model 512), its CSVs
#   bash scripts/bench_gpu.sh mqar OUT_DIR    # the calibrated MQAR capacity sweep (4 cells x 8
#                                             # seeds as ensembles), then its second held-out set
#   bash scripts/bench_gpu.sh mqar2 OUT_DIR   # its second round (the gate at 8 pairs on seeds
#                                             # 8-15, GQA-2 and MQA-32), then the held-out set
#
# Each step writes its log (and JSON) into OUT_DIR and a failing step does not stop the others.
# Needs data/tinyshakespeare.txt (python scripts/get_data.py tinyshakespeare). First run on an
# H100, 2026-11-23; parts of it on an H200, 2026-11-26: results in docs/studies/performance/chronology.md.
set -u
usage='usage: bench_gpu.sh train|rest|decode|flash|batch64|cublas|logits|roofline|next|next2|next3|studies|mqar|mqar2 OUT_DIR'
part=${1:?$usage}
out=${2:?$usage}
budget=${3:-570}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
# the scripts import lm from this checkout whether or not it is installed
export PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}"
# configs/gpt125m.py as every part but `logits` measured it: float32 logits, XLA's Triton GEMMs
# on (the config sets bfloat16 logits and Triton off since 2026-11-28)
before=(--set=model.logits_dtype=float32 --set=train.xla_options=)
step() {  # step NAME SECONDS COMMAND...: run with a time limit, log to OUT_DIR/NAME.log
  local name=$1 limit=$2
  shift 2
  local left=$((budget - SECONDS))
  if ((left < 30)); then
    echo "== $name: skipped ($left s of the $budget s budget left)"
    return
  fi
  ((limit > left)) && limit=$left
  echo "== $name: $*"
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  echo "== $name: rc $? in $((SECONDS - t0)) s"
  tail -n 12 "$out/$name.log"
}

# the decode rows of the roofline table: every variant on the fused kernel, 16 heads of 64
decode=(python3 scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --num_heads=16
  --d_model=1024 --dtype=bfloat16 --num_layers=12 --bandwidth_gib=4 --decode_kernel=pallas)

case $part in
train)
  step env 60 bash -c 'date -u; nvidia-smi; python3 -c "import jax, flax, optax, orbax.checkpoint as o;
print(jax.__version__, flax.__version__, optax.__version__, jax.devices())"'
  step train_dot_product 300 python3 scripts/bench_train.py --config=configs/gpt125m.py \
    "${before[@]}" --variants=mha,gqa4,mqa,mla --steps=30 \
    --set=model.attention_impl=dot_product --json="$out/train_dot_product.json"
  step train_einsum 130 python3 scripts/bench_train.py --config=configs/gpt125m.py "${before[@]}" \
    --variants=mha --steps=30 --set=model.attention_impl=einsum --json="$out/train_einsum.json"
  step decode 120 python3 scripts/bench_decode.py --contexts=8192 --batch=8 \
    --variants=mha,gqa4,mqa,mla --dtype=bfloat16 --d_model=768 --num_layers=12 \
    --json="$out/decode.json"
  ;;
rest)
  step train_cudnn 230 python3 scripts/bench_train.py --config=configs/gpt125m.py "${before[@]}" \
    --variants=mha,gqa4,mla --steps=20 --set=model.attention_impl=cudnn \
    --json="$out/train_cudnn.json"
  XLA_PYTHON_CLIENT_PREALLOCATE=false step test_gpu 70 python3 -m pytest tests/test_gpu.py \
    -q -n 4 -p no:cacheprovider
  step profile 150 python3 scripts/profile_train.py --config=configs/gpt125m.py "${before[@]}" \
    --variant=mha --steps=5 --top=20 --set=model.attention_impl=cudnn --trace_dir=/tmp/lm_profile
  XLA_PYTHON_CLIENT_PREALLOCATE=false step tests 110 python3 -m pytest -m 'not slow' -q -n 12 \
    -p no:cacheprovider --deselect tests/test_gpu.py
  ;;
decode)
  step decode 150 python3 scripts/bench_decode.py --contexts=8192,32768 --batch=8 \
    --variants=mha,gqa4,mqa,mla --dtype=bfloat16 --d_model=768 --num_layers=12 \
    --bandwidth_gib=4 --json="$out/decode.json"
  step decode_profile 150 python3 scripts/bench_decode.py --contexts=8192 --batch=8 \
    --variants=mha,gqa4,mqa,mla --dtype=bfloat16 --d_model=768 --num_layers=12 \
    --bandwidth_gib=4 --profile_top=15 --profile_dir=/tmp/lm_decode_profile
  step decode_h12 100 python3 scripts/bench_decode.py --contexts=8192 --batch=8 \
    --variants=mha,gqa4,mqa --num_heads=12 --dtype=bfloat16 --d_model=768 --num_layers=12 \
    --bandwidth_gib=4 --json="$out/decode_h12.json"
  ;;
flash)
  step env 60 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax; print(jax.__version__)"'
  XLA_PYTHON_CLIENT_PREALLOCATE=false step test_flash 150 python3 -m pytest \
    tests/test_flash_decode.py -q -n 0 -p no:cacheprovider
  for kernel in pallas xla; do
    step "decode_$kernel" 170 python3 scripts/bench_decode.py --contexts=8192 --batch=8,16 \
      --variants=mha,gqa4,mqa --num_heads=16 --d_model=1024 --dtype=bfloat16 --num_layers=12 \
      --bandwidth_gib=4 --decode_kernel=$kernel --json="$out/decode_$kernel.json"
  done
  ;;
batch64)
  step env 30 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax; print(jax.__version__)"'
  step decode_b64 130 python3 scripts/bench_decode.py --contexts=8192 --batch=32,64 \
    --variants=mha,gqa4 --num_heads=16 --d_model=1024 --dtype=bfloat16 --num_layers=12 \
    --bandwidth_gib=4 --decode_kernel=pallas --json="$out/decode_b64.json"
  train=(python3 scripts/bench_train.py --config=configs/gpt125m.py "${before[@]}" --variants=mha
    --steps=20 --set=model.attention_impl=cudnn --torch_baseline=false --rounds=1)
  step train_cudnn 130 "${train[@]}" --json="$out/train_cudnn.json"
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step train_no_triton 130 "${train[@]}" \
    --json="$out/train_no_triton.json"
  step profile 140 python3 scripts/profile_train.py --config=configs/gpt125m.py "${before[@]}" \
    --variant=mha --steps=5 --top=25 --set=model.attention_impl=cudnn --trace_dir=/tmp/lm_profile
  ;;
cublas)
  step env 30 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax; print(jax.__version__)"'
  step xla_options 200 python3 scripts/bench_xla_options.py --config=configs/gpt125m.py \
    "${before[@]}" --set=model.attention_impl=cudnn \
    --option=no_triton:xla_gpu_enable_triton_gemm=false --rounds=4
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step profile_no_triton 140 \
    python3 scripts/profile_train.py --config=configs/gpt125m.py "${before[@]}" --variant=mha \
    --steps=5 --top=25 --set=model.attention_impl=cudnn --trace_dir=/tmp/lm_profile_no_triton
  ;;
logits)
  # Both A/Bs' arms carry configs/gpt125m.py's settings as they were before 2026-11-28 (float32
  # logits, Triton GEMMs on), then change one: Triton off per compile; bfloat16 logits with
  # Triton off for the whole process (env flag)
  step env 30 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax; print(jax.__version__)"'
  ab=(python3 scripts/bench_xla_options.py --config=configs/gpt125m.py "${before[@]}" --rounds=3
    --set=model.attention_impl=cudnn)
  step ab_option_no_triton 150 "${ab[@]}" --option=no_triton:xla_gpu_enable_triton_gemm=false
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step ab_logits_no_triton 280 "${ab[@]}" \
    --option= --config_arm=logits16:model.logits_dtype=compute
  ;;
roofline)
  step env 60 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax, torch;
print(jax.__version__, torch.__version__, jax.devices())"'
  XLA_PYTHON_CLIENT_PREALLOCATE=false step test_flash 120 python3 -m pytest \
    tests/test_flash_decode.py -q -n 0 -p no:cacheprovider
  step decode_8k 150 "${decode[@]}" --contexts=8192 --batch=8,64 --json="$out/decode_8k.json"
  step decode_32k 110 "${decode[@]}" --contexts=32768 --batch=1,8 --json="$out/decode_32k.json"
  # torch.compile's first compile of the 125M model takes ~2 minutes of the MHA row
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 step train_peers 300 python3 scripts/bench_train.py \
    --config=configs/gpt125m.py --variants=mha,gqa4,mla --steps=20 --rounds=2 \
    --set=model.attention_impl=cudnn --json="$out/train_peers.json"
  ;;
next)
  step env 30 bash -c 'date -u; nvidia-smi -L; python3 -c "import jax, torch;
print(jax.__version__, torch.__version__, jax.devices())"'
  step decode_8k 150 "${decode[@]}" --contexts=8192 --batch=8,64 --json="$out/decode_8k.json"
  step decode_32k 110 "${decode[@]}" --contexts=32768 --batch=1,8 --json="$out/decode_32k.json"
  XLA_PYTHON_CLIENT_MEM_FRACTION=0.5 step train_peers 270 python3 scripts/bench_train.py \
    --config=configs/gpt125m.py --variants=mha,gqa4 --steps=20 --rounds=2 \
    --set=model.attention_impl=cudnn --json="$out/train_peers.json"
  ;;
next2)
  step env 30 bash -c 'date -u; nvidia-smi -L'
  # next's decode rows again, each with one XLA flag for the whole process: the loop's while and
  # conditionals captured as CUDA graphs (32k), cuBLAS for every GEMM (8k)
  XLA_FLAGS=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL step decode_32k_graphs 110 \
    "${decode[@]}" --contexts=32768 --batch=1,8 --json="$out/decode_32k_graphs.json"
  XLA_FLAGS=--xla_gpu_enable_triton_gemm=false step decode_8k_cublas 150 "${decode[@]}" \
    --contexts=8192 --batch=8,64 --json="$out/decode_8k_cublas.json"
  step decode_profile 130 "${decode[@]}" --variants=mqa,gqa4 --contexts=8192 --batch=64 \
    --profile_top=22 --profile_dir=/tmp/lm_decode_profile
  ;;
next3)
  step env 30 bash -c 'date -u; nvidia-smi -L'
  step train_mla 150 python3 scripts/bench_train.py --config=configs/gpt125m.py --variants=mla \
    --steps=20 --set=model.attention_impl=cudnn --torch_baseline=false \
    --json="$out/train_mla.json"
  step profile 150 python3 scripts/profile_train.py --config=configs/gpt125m.py --variant=mha \
    --steps=5 --top=25 --set=model.attention_impl=cudnn --trace_dir=/tmp/lm_profile
  ;;
studies)
  # The cost side as seed ensembles on one GPU, writing the CPU studies' CSVs (sweep summaries):
  # the kv_contrast sweep as published (1,000 steps, 20 seeds), then at 4x the width
  contrast=(python3 scripts/sweep.py --config=configs/sweeps/attention_kinds.py
    --points=mha,gqa4,gqa2,mqa --seeds=20 --ensemble --config.train.steps=1000
    --config.eval_every=1000 --config.data.path=data/tinyshakespeare.txt)
  step kv_contrast 200 "${contrast[@]}" --sweep_dir="$out/kv_contrast"
  step kv_contrast_d512 320 "${contrast[@]}" --sweep_dir="$out/kv_contrast_d512" \
    --config.model.d_model=512 --config.model.head_dim=64 --config.model.mlp_dim=1536
  ;;
mqar)
  # docs/studies/mqar_capacity: the calibrated cells as on the CPU (vmapped ensembles here), one
  # sweep per pairs count, each scored on recall_seed 1's rows of its own pairs (eval_sweep.py
  # replaces a run's whole data config, so a sweep holds one pairs count)
  for p in 4 8; do
    step "mqar_p$p" 200 python3 scripts/sweep.py --config=configs/sweeps/mqar_capacity.py \
      --points="mha_p$p,mqa_p$p" --seeds=8 --ensemble --sweep_dir="$out/mqar_p$p"
    step "mqar_p${p}_test" 60 python3 scripts/eval_sweep.py --sweep_dir="$out/mqar_p$p" \
      --config=configs/sweeps/mqar_capacity.py --config.data.recall_seed=1 \
      --config.data.recall_pairs="$p" --config.data.seq_len=$((4 * p)) \
      --out="$out/mqar_p${p}_test.csv"
  done
  ;;
mqar2)
  step mqar_r2 400 python3 scripts/sweep.py --config=configs/sweeps/mqar_capacity.py \
    --points=mha_p8_gate,gqa2_p8,mqa_hd32_p8 --seeds=8 --ensemble --sweep_dir="$out/mqar_r2"
  step mqar_r2_test 90 python3 scripts/eval_sweep.py --sweep_dir="$out/mqar_r2" \
    --config=configs/sweeps/mqar_capacity.py --config.data.recall_seed=1 \
    --config.data.recall_pairs=8 --config.data.seq_len=32 --out="$out/mqar_r2_test.csv"
  ;;
*)
  echo "unknown part $part (train|rest|decode|flash|batch64|cublas|logits|roofline|next|next2|next3|studies|mqar|mqar2)" >&2
  exit 2
  ;;
esac
