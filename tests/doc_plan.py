"""The plan of tests/test_doc_commands*.py: every shell command of README.md and docs/*.md runs,
scaled down, in a scratch directory.

The commands are the bash blocks' lines (continuations joined, comments dropped; a `for` loop is
one command). `PLAN` says what the tests do with each, keyed by its exact text, so a command
added to the docs (or changed) fails tests/test_doc_commands.py until it is listed here:

- `Run(subs, extra)`: runs it (bash, in the scratch directory, in document order: README first)
  after the substitutions `subs` (old -> new, the explicit scaling), with `extra` appended to the
  command; every `train.py --config` and `sweep.py --config` also gets `TINY` (a 1-layer model of
  width 32, 40 steps, checkpoints and evaluations every 20). Run commands chain: train, then
  eval, uptrain, analysis and export read what earlier ones wrote. `CHAINS` cuts the docs into
  chains that share no runs, each one test in its own file, so the suite's workers share them.
- `Flags(subs)`: benchmarks, multi-host and long experiments: each `python` command gets
  `--help` appended (so a real `python` would run nothing); tests/test_doc_flags.py records the
  invocations bash makes and parses each one's flags with its entry point's own parser
  (tests/flag_parse.py: an unknown flag or config key fails), running nothing.
- `Skip(reason)`: what cannot run here at all.

A line that only sets a shell variable (`COMMON=...`) is kept for its document's later commands.
Data: `data/tinyshakespeare.txt` and `prompts.txt` are texts the tests write (no network);
scripts/get_data.py is only flag-checked (it would download). `docs/` is a copy without the files
the commands write (figures, the recall sweep CSVs), so they write and rewrite the copy.
"""

import dataclasses
import os
import re
import shutil
import subprocess
import sys

from conftest import ROOT, stdlib_text

DOCS = ['README.md'] + sorted(f'docs/{p.name}' for p in (ROOT / 'docs').glob('*.md'))
TINY = (
    '--config.model.d_model=32 --config.model.num_layers=1 --config.data.seq_len=16 '
    '--config.train.steps=40 --config.eval_every=20 --config.log_every=20 '
    '--config.checkpoint_every=20 --config.eval_tokens=64 --config.train.warmup_steps=2 '
    '--config.data.cache_dir=cache --config.compilation_cache_dir=xla'
)
TEXT = '--config.data.source=text --config.data.path=data/tinyshakespeare.txt'
ANALYSIS = {'@2000': '@40', '@2100': '@42'}  # 40 source steps, then round(0.05 * 40) = 2
SMALL_ANALYSIS = '--batch=4 --max_batches=2 --num_random=4'
# The recall tasks at TINY's seq_len (MQAR: 4 x pairs <= 16) with a small held-out set; passkey
# examples need >= 102 bytes, so its rows stay longer.
MQAR_EVAL = '--config.data.recall_eval_examples=64 --config.eval_batch_size=32'
# configs/recall/mqar.py's batch of 128 is more rows than the 64 held-out ones: 32
MQAR = f'--config.data.recall_pairs=2 --config.train.batch_size=32 {MQAR_EVAL}'
PASSKEY_DATA = (
    '--config.data.seq_len=128 --config.data.passkey_lengths=102,129 '
    '--config.data.recall_eval_examples=20'
)
PASSKEY = f'{PASSKEY_DATA} --config.eval_batch_size=10 --config.train.batch_size=8'


@dataclasses.dataclass(frozen=True)
class Run:
    subs: tuple[tuple[str, str], ...] = ()
    extra: str = ''


@dataclasses.dataclass(frozen=True)
class Flags:
    subs: tuple[tuple[str, str], ...] = ()


@dataclasses.dataclass(frozen=True)
class Skip:
    reason: str


BENCH = Flags()
# docs/studies/recall/README.md's calibration runs: the same entry point and code path as the chain's MQAR run
# with other learning rates, ties and widths, so only their flags are checked
CAL = Flags()
SERVER = Skip('tensorboard serves until stopped')
REUSE_SCREENS = Skip("copies the passkey screens' runs, which the tests only flag-check")
PIP = Skip('installs into the environment the suite runs in')
GET_DATA = Flags()  # downloads; tests/test_fresh_clone.py checks it offline
# docs/ files the doc commands write
MADE = (
    '*.png',
    'recall_seeds.csv',
    'recall_seeds_3000.csv',
    'recall_lr_mha.csv',
    'recall_lr_mla.csv',
    'recall_seeds_10.csv',
    'recall_s5-9_curves.csv',
    'recall_sweep_curves.csv',
    'passkey_calibration.csv',
    'passkey_seeds.csv',
    'passkey_lr_screen.csv',
    'passkey_sweep_curves.csv',
    'passkey_sweep_depths.csv',
    'passkey_test.csv',
)
FIXTURE = str(ROOT / 'tests' / 'fixtures' / 'hf' / 'llama_mha')  # 4 heads, 2 layers, width 32

PLAN = {
    # README.md
    "pip install -e '.[dev]'": PIP,
    'pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu': PIP,
    "pip install -e '.[dev,hf]'": PIP,
    'python train.py --config=configs/quickstart.py --workdir=runs/quickstart': Run(extra=TEXT),
    'tensorboard --logdir runs/quickstart/tb': SERVER,
    'pytest -q': Skip('the suite itself'),
    'pytest -q -m "not slow"': Skip('the suite itself'),
    'python scripts/get_data.py tinyshakespeare': GET_DATA,
    'python train.py --config=configs/shakespeare_char.py:gqa2 --workdir=runs/gqa2 '
    '--config.data.path=data/tinyshakespeare.txt --config.train.steps=500 '
    '--config.model.dtype=bfloat16': Run(),
    'python -c "from lm.config import load_config_file as f; '
    "print(f('configs/shakespeare_char.py', 'gqa2'))\"": Run(),
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/shakespeare_mha '
    '--config.data.path=data/tinyshakespeare.txt': Run(),
    'python eval.py --workdir=runs/shakespeare_mha': Run(),
    'python eval.py --workdir=runs/quickstart': Run(),
    'python eval.py --workdir=runs/quickstart --kv_cache_dtype=int8': Run(),
    'python eval.py --workdir=runs/quickstart --step=400 --split=train --eval_tokens=100000': Run(
        subs=(('--step=400', '--step=20'), ('--eval_tokens=100000', '--eval_tokens=256'))
    ),
    'python eval.py --workdir=runs/gqa2 --config=configs/shakespeare_char.py '
    '--config.data.path=other.txt': Run(  # eval.py takes only data settings from --config
        extra='--config.data.seq_len=16 --config.data.cache_dir=cache'
    ),
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/one '
    '--config.data.path=data/tinyshakespeare.txt': Flags(),  # runs/shakespeare_mha's command
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/node '
    '--config.data.path=data/tinyshakespeare.txt --config.train.batch_size=16 '
    '--config.mesh.data=2 --config.mesh.fsdp=2 --config.mesh.tensor=2': Flags(),  # 8 GPUs
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/cpu8 '
    '--config.data.path=data/tinyshakespeare.txt --config.train.batch_size=16 '
    '--config.mesh.cpu_devices=8 --config.mesh.data=2 --config.mesh.fsdp=2 '
    '--config.mesh.tensor=2': Flags(),  # run as written: tests/test_fresh_clone.py
    'python train.py --config=configs/shakespeare_char.py --workdir=/shared/runs/cluster '
    '--config.data.path=/shared/data/tinyshakespeare.txt --config.train.batch_size=64 '
    '--config.mesh.data=-1 --config.mesh.fsdp=8 --coordinator_address=host0:1234 '
    '--num_processes=4 --process_id=$RANK': Flags(),  # 4 hosts
    'gcloud compute tpus tpu-vm ssh my-pod --worker=all --command="cd lm && python train.py '
    '--config=configs/shakespeare_char.py --workdir=gs://bucket/runs/pod '
    '--config.data.path=tinyshakespeare.txt --config.train.batch_size=64 '
    '--config.mesh.fsdp=-1 --config.mesh.tensor=1 --distributed"': Skip('a TPU pod'),
    'python scripts/uptrain.py --src=runs/shakespeare_mha --dst=runs/gqa2_uptrained '
    '--num_kv_heads=2': Run(),
    'python train.py --workdir=runs/gqa2_uptrained': Run(),
    'python scripts/analyze_heads.py --workdir=runs/shakespeare_mha '
    '--compare=runs/gqa2_uptrained@2000 --compare=runs/gqa2_uptrained '
    '--out=runs/heads_mha_vs_gqa2': Run(subs=(('@2000', '@40'),), extra=SMALL_ANALYSIS),
    'python scripts/convert_hf.py import --hf_dir=meta-llama/Llama-2-7b-hf '
    '--workdir=runs/llama2 --config=configs/base.py --config.data.seq_len=1024 '
    '--config.train.lr=3e-5': Run(
        subs=(('meta-llama/Llama-2-7b-hf', FIXTURE), ('seq_len=1024', 'seq_len=16')),
        extra=f'{TEXT} --config.data.cache_dir=cache --config.eval_tokens=64',
    ),
    'python eval.py --workdir=runs/llama2': Run(),
    'python scripts/generate.py --workdir=runs/llama2 --prompt="The capital of France is"': Run(
        extra='--max_new_tokens=4'
    ),
    'python scripts/uptrain.py --src=runs/llama2 --dst=runs/llama2_gqa8 --num_kv_heads=8 '
    '--steps=2000': Run(subs=(('--num_kv_heads=8', '--num_kv_heads=2'), ('=2000', '=2'))),
    'python train.py --workdir=runs/llama2_gqa8': Run(),
    'python scripts/convert_hf.py export --workdir=runs/llama2_gqa8 '
    '--hf_dir=out/llama2_gqa8': Run(),
    'python scripts/generate.py --workdir=runs/shakespeare_mha --prompt="ROMEO:" '
    '--max_new_tokens=200': Run(subs=(('=200', '=8'),)),
    'python scripts/generate.py --workdir=runs/shakespeare_mha --prompt="ROMEO:" '
    '--prompt="JULIET:" --sampling=temperature=0.8,top_k=40,top_p=0.95': Run(
        extra='--max_new_tokens=8'
    ),
    'python scripts/generate.py --workdir=runs/shakespeare_mha --prompts_file=prompts.txt': Run(
        extra='--max_new_tokens=8'
    ),
    'python scripts/bench_decode.py': BENCH,
    'python scripts/bench_decode.py --json=decode.json && '
    'python scripts/plot_roofline.py --json=decode.json': BENCH,
    'python scripts/sweep.py --config=configs/shakespeare_char.py --sweep_dir=runs/heads '
    '--config.data.path=data/tinyshakespeare.txt --grid model.attention=gqa '
    '--grid model.num_heads=4,8 --grid model.num_kv_heads=1,2,4,8': Run(
        subs=(('num_heads=4,8', 'num_heads=4'), ('num_kv_heads=1,2,4,8', 'num_kv_heads=1,2'))
    ),
    'python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds '
    '--seeds=3': Run(subs=(('--seeds=3', '--seeds=1 --points=mha,mla'),)),
    'tensorboard --logdir runs/kinds/tb': SERVER,
    'python scripts/bench_train.py': BENCH,
    'python scripts/profile_train.py': BENCH,
    'python scripts/bench_torch_baseline.py': BENCH,
    'python scripts/bench_xla_options.py': BENCH,
    # docs/analysis.md: seed 0, at 40 + 2 steps (the loop over seeds 1-4 is only flag-checked)
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/analysis_mha '
    '--config.data.path=data/tinyshakespeare.txt': Run(),
    'python scripts/uptrain.py --src=runs/analysis_mha --dst=runs/analysis_gqa2 '
    '--num_kv_heads=2': Run(),
    'python train.py --workdir=runs/analysis_gqa2': Run(),
    'python scripts/analyze_heads.py --workdir=runs/analysis_mha '
    '--compare=runs/analysis_gqa2@2000 --compare=runs/analysis_gqa2@2100 '
    '--out=runs/heads_analysis': Run(subs=tuple(ANALYSIS.items()), extra=SMALL_ANALYSIS),
    'for s in 1 2 3 4; do\n'
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/analysis_mha_s$s '
    '--config.data.path=data/tinyshakespeare.txt --config.seed=$s\n'
    'python scripts/uptrain.py --src=runs/analysis_mha_s$s --dst=runs/analysis_gqa2_s$s '
    '--num_kv_heads=2\n'
    'python train.py --workdir=runs/analysis_gqa2_s$s\n'
    'python scripts/analyze_heads.py --workdir=runs/analysis_mha_s$s '
    '--compare=runs/analysis_gqa2_s$s@2000 --compare=runs/analysis_gqa2_s$s@2100 '
    '--out=runs/heads_s$s\n'
    'done': Flags(),  # the four commands above again, per seed
    # docs/data.md
    'python scripts/bench_data.py --workdir=/tmp/bench_data': BENCH,
    'python scripts/bench_data.py --workdir=/tmp/bench_data --json=data.json '
    '--num_proc=1,2,4,8': BENCH,
    'python scripts/sweep.py --config=configs/sweeps/data_sampling.py --sweep_dir=runs/sampling '
    '--seeds=5': Run(subs=(('--seeds=5', '--seeds=1'),), extra=TEXT),
    # docs/decoding.md
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --contexts=8192 --batch=4': BENCH,
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --contexts=8192 --batch=4 '
    '--xla_defaults': BENCH,
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --contexts=1024,8192,32768 '
    '--batch=1,4,8 --new_tokens=16 --json=f32.json': BENCH,
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --contexts=1024,8192 --batch=4 '
    '--new_tokens=8 --dtype=bfloat16 --json=bf16.json': BENCH,
    'python scripts/plot_roofline.py --json=f32.json,bf16.json': BENCH,
    # docs/kv_layouts.md: CLA needs two layers; the 2-layer MHA source is the imported fixture
    'python train.py --config=configs/shakespeare_char.py --workdir=runs/mqa_cla2_scratch '
    '--config.model.attention=mqa --config.model.kv_share_every=2': Run(
        extra='--config.model.num_layers=2'
    ),
    'python scripts/uptrain.py --src=runs/mha --dst=runs/mqa_cla2 --num_kv_heads=1 '
    '--kv_share_every=2': Run(subs=(('runs/mha', 'runs/llama2'),), extra='--steps=2'),
    'python scripts/uptrain.py --src=runs/mha --dst=runs/cla2 --kv_share_every=2 '
    '--grouping=similarity --method=aligned': Run(
        subs=(('runs/mha', 'runs/llama2'),), extra='--steps=2'
    ),
    'python train.py --workdir=runs/mqa_cla2': Run(),
    'python scripts/uptrain.py --src=runs/mha --dst=runs/kv6 --kv_budget=6 '
    '--grouping=similarity --method=mean': Run(
        subs=(('runs/mha', 'runs/llama2'),), extra='--steps=2'
    ),
    'python train.py --workdir=runs/kv6': Run(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=1000 '
    '--seeds=5 --targets= --methods=mean,first,similarity-aligned --cla=cla2,mqa_cla2 '
    '--fractions=0,0.1 --scratch_fractions=0.1 --out_dir=runs/uptrain_cla1k --parallel=2': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/kv_layouts.py --sweep_dir=runs/kv_layouts '
    '--config.data.path=data/tinyshakespeare.txt --config.train.steps=1000 --seeds=5 '
    '--points=mha,gqa2,mqa,mla,cla2,mha_local': Flags(),
    'python scripts/cache_quality.py --sweep_dir=runs/kv_layouts --points=mha,mqa '
    '--kv_cache_dtypes=int8,kivi4 --out=docs/studies/kv_layouts/results/kv_cache_seeds.csv '
    '--sweep_out=docs/studies/kv_layouts/results/kv_layouts_seeds.csv '
    '--pareto_table=docs/studies/kv_layouts/results/kv_layouts_pareto.csv': Flags(),
    'python scripts/plot_pareto.py --table=docs/studies/kv_layouts/results/kv_layouts_pareto.csv '
    '--out=docs/studies/kv_layouts/kv_layouts_pareto.png': Run(),
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla,cla2,mqa_cla2,gqa4_local '
    '--window=256 --layer_pattern=LLLG --contexts=1024,8192 --batch=4 --new_tokens=16 '
    '--kv_cache_dtype=float': BENCH,
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla,gqa4_local --window=256 '
    '--layer_pattern=LLLG --contexts=1024,8192 --batch=4 --new_tokens=16 '
    '--kv_cache_dtype=int8': BENCH,
    'python scripts/bench_decode.py --variants=mha,gqa4,mqa,mla --contexts=1024,8192 --batch=4 '
    '--new_tokens=16 --kv_cache_dtype=kivi4': BENCH,
    'python scripts/bench_decode.py --d_model=256 --num_layers=4 --contexts=1024,4096 --batch=1 '
    '--new_tokens=16 --variants=mha,gqa4,gqa4_local --window=256 --layer_pattern=LLLG '
    '--kv_cache_dtype=float': BENCH,
    # docs/performance.md
    'python scripts/bench_train.py --steps=60 --rounds=5': BENCH,
    'python scripts/bench_train.py --steps=60 --rounds=5 '
    '--data_path=data/tinyshakespeare.txt': BENCH,
    'python scripts/bench_train.py --variants=mha,mla --steps=40 --rounds=4 '
    '--torch_threads=1': BENCH,
    'python scripts/bench_train.py --set=train.steps_per_call=1': BENCH,
    'python train.py --config=configs/shakespeare_char.py --workdir=/tmp/ttq/run '
    '--config.data.path=data/tinyshakespeare.txt --config.eval_every=100': BENCH,
    'python scripts/bench_torch_baseline.py --target_loss=1.886 --eval_every=100 --threads=1 '
    '--data_path=data/tinyshakespeare.txt': BENCH,
    'python scripts/profile_train.py --top=20': BENCH,
    'for c in 0 1; do taskset -c $c python scripts/bench_train.py --variants=mha --steps=100 '
    '--set=mesh.cpu_devices=1 --set=train.batch_size=6 & done; wait': BENCH,
    'python -m cProfile -s tottime train.py --config=configs/shakespeare_char.py '
    '--workdir=/tmp/prof --config.data.path=data/tinyshakespeare.txt --config.train.steps=400 '
    '--config.eval_every=400 --config.checkpoint_every=400 --config.eval_tokens=1536': BENCH,
    'for r in 1 2; do python train.py --config=configs/shakespeare_char.py --workdir=/tmp/cc$r '
    '--config.data.path=data/tinyshakespeare.txt --config.train.steps=20 '
    '--config.compilation_cache_dir=/tmp/xla; done': BENCH,
    'python scripts/bench_xla_options.py --option=ynn_dots:'
    'xla_cpu_experimental_ynn_fusion_type=LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT --rounds=12': BENCH,
    'bash scripts/bench_gpu.sh train OUT_DIR': Skip('a GPU'),
    'bash scripts/bench_gpu.sh rest OUT_DIR': Skip('a GPU'),
    'bash scripts/bench_gpu.sh decode OUT_DIR': Skip('a GPU'),
    'bash scripts/bench_gpu.sh batch64 OUT_DIR': Skip('a GPU'),
    'bash scripts/bench_gpu.sh logits OUT_DIR': Skip('a GPU'),
    'python scripts/bench_decode.py --contexts=8192 --batch=8 --variants=mha,gqa4,mqa,mla '
    '--dtype=bfloat16 --d_model=768 --num_layers=12': BENCH,
    'python scripts/bench_train.py --config=configs/gpt125m.py --variants=mha --steps=20 '
    '--set=model.attention_impl=cudnn --torch_baseline=false': Skip('a GPU (cuDNN attention)'),
    'python scripts/profile_train.py --config=configs/gpt125m.py --variant=mha --steps=5 --top=25 '
    '--set=model.attention_impl=cudnn': Skip('a GPU (cuDNN attention)'),
    'python scripts/bench_decode.py --contexts=8192,32768 --batch=8 --variants=mha,gqa4,mqa,mla '
    '--dtype=bfloat16 --d_model=768 --num_layers=12 --bandwidth_gib=4': BENCH,
    'python scripts/bench_decode.py --contexts=8192 --batch=8 --variants=mha,gqa4 --new_tokens=32 '
    '--dtype=bfloat16 --d_model=768 --num_layers=12 --bandwidth_gib=4 --repeats=5': BENCH,
    'python scripts/bench_decode.py --contexts=8192 --batch=8 --variants=mha,gqa4 --new_tokens=64 '
    '--dtype=bfloat16 --d_model=768 --num_layers=12 --bandwidth_gib=4 --repeats=5': BENCH,
    'python scripts/bench_decode.py --contexts=8192 --batch=8,16 --num_heads=16 '
    '--variants=mha,gqa4,mqa --dtype=bfloat16 --d_model=768 --num_layers=12 '
    '--bandwidth_gib=4': BENCH,
    'python scripts/bench_decode.py --contexts=8192 --batch=8,16,32 --variants=mha,gqa4,mqa '
    '--num_heads=16 --d_model=1024 --dtype=bfloat16 --num_layers=12 --bandwidth_gib=4 '
    '--decode_kernel=pallas': BENCH,
    'python scripts/bench_decode.py --contexts=8192 --batch=32,64 --variants=mha,gqa4 '
    '--num_heads=16 --d_model=1024 --dtype=bfloat16 --num_layers=12 --bandwidth_gib=4 '
    '--decode_kernel=pallas': BENCH,
    # docs/studies/recall/README.md: the tasks at the tiny size (fewer pairs, shorter passkey examples); its
    # sweeps run too, so curve_csv.py and make_tables.py read real event files (in the scratch
    # copy of docs/)
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/mqar_mha': Run(extra=MQAR),
    'python eval.py --workdir=runs/mqar_mha': Run(),
    'python docs/studies/recall/recall_by_order.py --workdir=runs/mqar_mha': Run(),
    'python train.py --config=configs/recall/passkey.py:mqa --workdir=runs/passkey_mqa': Run(
        extra=PASSKEY
    ),
    'C1K="--config.train.steps=1000 --config.checkpoint_every=1000 --config.eval_every=250"': Run(),
    'TIED="--config.model.tie_embeddings=True"': Run(),
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_tied_lr1.5e-3 $C1K '
    '$TIED --config.train.lr=1.5e-3 --config.train.min_lr=1.5e-3': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_tied_lr3e-3 $C1K '
    '$TIED': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_lr1.5e-3 $C1K '
    '--config.train.lr=1.5e-3 --config.train.min_lr=1.5e-3': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_lr1.5e-3_bias $C1K '
    '--config.train.lr=1.5e-3 --config.train.min_lr=1.5e-3 --config.model.qkv_bias=True': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_lr3e-3 $C1K': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_h8x16 '
    '--config.model.num_heads=8': CAL,
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/cal_h8x32 '
    '--config.model.num_heads=8 --config.model.head_dim=32': CAL,
    'python docs/studies/recall/curve_csv.py --tag=eval/recall_accuracy '
    '--out=docs/studies/recall/results/mqar_calibration_s32.csv --runs=tied_lr1.5e-3=runs/cal_tied_lr1.5e-3/tb,'
    'tied_lr3e-3=runs/cal_tied_lr3e-3/tb,lr1.5e-3=runs/cal_lr1.5e-3/tb,'
    'lr1.5e-3_bias=runs/cal_lr1.5e-3_bias/tb,lr3e-3=runs/cal_lr3e-3/tb,h8x16=runs/cal_h8x16/tb,'
    'h8x32=runs/cal_h8x32/tb': CAL,
    'python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall '
    '--seeds=5': Run(subs=(('--seeds=5', '--seeds=1 --points=mha,mqa'),), extra=MQAR),
    'cp runs/recall/summary_seeds.csv docs/studies/recall/results/recall_seeds.csv': Run(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_sweep_curves.csv '
    '--sweep_dir=runs/recall': Run(),
    'python scripts/plot_pareto.py --run_dir=runs/recall --metric=eval/recall_accuracy '
    '--out=docs/studies/recall/recall_pareto.png': Run(),
    # the extension: TINY's 40 steps, then 60 (extra comes after TINY)
    'python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall --seeds=5 '
    '--config.train.steps=3000 --config.mesh.cpu_devices=1 --parallel=2': Run(
        subs=(('--seeds=5', '--seeds=1 --points=mha,mqa'),),
        extra=f'{MQAR} --config.train.steps=60',
    ),
    'cp runs/recall/summary_seeds.csv docs/studies/recall/results/recall_seeds_3000.csv': Run(),
    'python scripts/plot_pareto.py --run_dir=runs/recall --metric=eval/recall_accuracy '
    '--out=docs/studies/recall/recall_pareto_3000.png': Run(),
    'python scripts/sweep.py --config=configs/sweeps/recall_lr.py --sweep_dir=runs/recall_lr '
    '--seeds=5 --points=mha_lr1e-3,mha_lr6e-3,mla_lr1e-3 --config.mesh.cpu_devices=1 '
    '--parallel=2': Run(subs=(('--seeds=5', '--seeds=1'),), extra=MQAR),
    'for arm in mha mla; do { head -1 runs/recall_lr/summary_seeds.csv; { grep "^${arm}_lr" '
    'runs/recall_lr/summary_seeds.csv; grep "^$arm," docs/studies/recall/results/recall_seeds.csv | '
    'sed "s/^$arm,/${arm}_lr3e-3,/"; } | sort -s -t, -k1,1; } > docs/results/recall_lr_$arm.csv; '
    'done': Run(),
    'python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall_s5-9 '
    '--seeds=5 --grid seed=5 --config.mesh.cpu_devices=1 --parallel=2': Run(
        subs=(('--seeds=5', '--seeds=1 --points=mha'),), extra=MQAR
    ),
    '{ cat docs/studies/recall/results/recall_seeds.csv; tail -n +2 runs/recall_s5-9/summary_seeds.csv; } > '
    'docs/studies/recall/results/recall_seeds_10.csv': Run(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_s5-9_curves.csv '
    '--sweep_dir=runs/recall_s5-9': Run(),
    'python scripts/sweep.py --config=configs/sweeps/recall_h8.py --sweep_dir=runs/recall_h8 '
    '--seeds=5 --config.mesh.cpu_devices=1 --parallel=2': Flags(),
    'cp runs/recall_h8/summary_seeds.csv docs/studies/recall/results/recall_h8_seeds.csv': Skip(
        "copies the 8-head sweep's summary; the tests only flag-check that sweep"
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_h8_curves.csv '
    '--sweep_dir=runs/recall_h8': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall_h8.py --sweep_dir=runs/recall_h8_s5-9 '
    '--seeds=5 --grid seed=5 --points=mha,mqa --config.mesh.cpu_devices=1 --parallel=2': Flags(),
    'cp runs/recall_h8_s5-9/summary_seeds.csv docs/studies/recall/results/recall_h8_s5-9_seeds.csv': Skip(
        'copies the 8-head seeds 5-9 summary; the tests only flag-check that sweep'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_h8_s5-9_curves.csv '
    '--sweep_dir=runs/recall_h8_s5-9': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall_h8.py --sweep_dir=runs/recall_h8_s5-9 '
    '--seeds=5 --grid seed=5 --points=mha,mqa --config.train.steps=3000 '
    '--config.mesh.cpu_devices=1 --parallel=2': Flags(),
    'cp runs/recall_h8_s5-9/summary_seeds.csv docs/studies/recall/results/recall_h8_s5-9_seeds_3000.csv': Skip(
        'copies the 8-head seeds 5-9 summary at 3,000 steps; the tests only flag-check that sweep'
    ),
    'python scripts/sweep.py --config=configs/sweeps/recall_mla.py --sweep_dir=runs/recall_mla '
    '--seeds=5 --config.mesh.cpu_devices=1 --parallel=2': Flags(),
    '{ head -1 runs/recall_mla/summary_seeds.csv; grep "^mla," docs/studies/recall/results/recall_seeds_10.csv; '
    'tail -n +2 runs/recall_mla/summary_seeds.csv; } > docs/studies/recall/results/recall_mla_seeds.csv': Skip(
        'joins the MLA screen, only flag-checked, to the committed seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_mla_curves.csv '
    '--sweep_dir=runs/recall_mla': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall_params '
    '--seeds=5 --grid seed=5 --match=params --points=gqa2,mqa,mla --config.mesh.cpu_devices=1 '
    '--parallel=2': Flags(),
    '{ head -1 runs/recall_params/summary_seeds.csv; grep "^mha,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv; tail -n +2 runs/recall_params/summary_seeds.csv; } > '
    'docs/studies/recall/results/recall_params_seeds.csv': Skip(
        'joins the equal-parameter sweep, only flag-checked, to the committed seeds'
    ),
    '{ head -1 runs/recall_params/summary_seeds.csv; for v in gqa2 mqa mla; do grep "^$v,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv | sed "s|^$v,|$v/width,|"; grep "^$v," '
    'runs/recall_params/summary_seeds.csv | sed "s|^$v,|$v/params,|"; done; } > '
    'docs/studies/recall/results/recall_params_vs_width.csv': Skip(
        'joins the equal-parameter sweep, only flag-checked, to the committed seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_params_curves.csv '
    '--sweep_dir=runs/recall_params': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall_mix.py --sweep_dir=runs/recall_mix '
    '--seeds=5 --grid seed=5 --points=mha --config.mesh.cpu_devices=1 --parallel=2': Flags(),
    '{ head -1 runs/recall_mix/summary_seeds.csv; grep "^mha,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv | sed "s|^mha,|mha_rows8,|"; tail -n +2 '
    'runs/recall_mix/summary_seeds.csv | sed "s|^mha,|mha_mix,|"; } > '
    'docs/studies/recall/results/recall_mix_seeds.csv': Skip(
        'joins the mixture screen, only flag-checked, to the committed MHA seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_mix_curves.csv '
    '--sweep_dir=runs/recall_mix': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall_width.py:64 '
    '--sweep_dir=runs/recall_d64 --seeds=5 --grid seed=5 --points=mha '
    '--config.mesh.cpu_devices=1 --parallel=2': Flags(),
    '{ head -1 runs/recall_d64/summary_seeds.csv; grep "^mha,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv | sed "s|^mha,|mha_d128,|"; tail -n +2 '
    'runs/recall_d64/summary_seeds.csv | sed "s|^mha,|mha_d64,|"; } > '
    'docs/studies/recall/results/recall_d64_seeds.csv': Skip(
        'joins the d_model 64 calibration, only flag-checked, to the committed MHA seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_d64_curves.csv '
    '--sweep_dir=runs/recall_d64': Flags(),
    'for lr in 1e-3 6e-3; do python scripts/sweep.py --config=configs/sweeps/recall_width.py:64 '
    '--sweep_dir=runs/recall_d64_lr$lr --seeds=5 --grid seed=5 --points=mha '
    '--config.train.lr=$lr --config.train.min_lr=$lr --config.mesh.cpu_devices=1 --parallel=2; '
    'done': Flags(),
    '{ head -1 runs/recall_d64/summary_seeds.csv; for lr in 1e-3 6e-3; do tail -n +2 '
    'runs/recall_d64_lr$lr/summary_seeds.csv | sed "s|^mha,|mha_lr$lr,|"; done; tail -n +2 '
    'runs/recall_d64/summary_seeds.csv | sed "s|^mha,|mha_lr3e-3,|"; } > '
    'docs/studies/recall/results/recall_d64_lr_seeds.csv': Skip(
        'joins the d_model 64 rate screen, only flag-checked, to the 3e-3 calibration'
    ),
    'python scripts/sweep.py --config=configs/sweeps/recall_width.py:256 '
    '--sweep_dir=runs/recall_d256 --seeds=5 --grid seed=5 --points=mha '
    '--config.mesh.cpu_devices=1 --parallel=2': Flags(),
    '{ head -1 runs/recall_d256/summary_seeds.csv; grep "^mha,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv | sed "s|^mha,|mha_d128,|"; tail -n +2 '
    'runs/recall_d256/summary_seeds.csv | sed "s|^mha,|mha_d256,|"; } > '
    'docs/studies/recall/results/recall_d256_seeds.csv': Skip(
        'joins the d_model 256 calibration, only flag-checked, to the committed MHA seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_d256_curves.csv '
    '--sweep_dir=runs/recall_d256': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/recall.py --sweep_dir=runs/recall_mlp '
    '--seeds=5 --grid seed=5 --grid model.mlp_dim=256,512 --points=mha '
    '--config.mesh.cpu_devices=1 --parallel=2': Flags(),
    '{ head -1 runs/recall_mlp/summary_seeds.csv; grep "^mha,[5-9]," '
    'docs/studies/recall/results/recall_seeds_10.csv | sed "s|^mha,|mha_mlp_dim384,|"; tail -n +2 '
    'runs/recall_mlp/summary_seeds.csv; } > docs/studies/recall/results/recall_mlp_seeds.csv': Skip(
        'joins the MLP-width runs, only flag-checked, to the committed MHA seeds'
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/recall_mlp_curves.csv '
    '--sweep_dir=runs/recall_mlp': Flags(),
    'for s in 0 1 2 3 4; do python train.py --config=configs/recall/mqar.py:mha '
    '--workdir=runs/mqar_b64/mha_s$s --config.seed=$s --config.mesh.cpu_devices=1 '
    '--config.train.batch_size=64 --config.train.steps=3000 --config.checkpoint_every=3000; '
    'done': Flags(),
    'python train.py --config=configs/recall/mqar.py:mha --workdir=runs/mqar_warm500_s4 '
    '--config.seed=4 --config.mesh.cpu_devices=1 --config.train.warmup_steps=500': Flags(),
    'python docs/studies/recall/curve_csv.py --tag=eval/recall_accuracy --out=docs/studies/recall/results/mqar_b64.csv '
    '--runs=b64_s0=runs/mqar_b64/mha_s0/tb,b64_s1=runs/mqar_b64/mha_s1/tb,'
    'b64_s2=runs/mqar_b64/mha_s2/tb,b64_s3=runs/mqar_b64/mha_s3/tb,b64_s4=runs/mqar_b64/mha_s4/tb,'
    'warm500_s4=runs/mqar_warm500_s4/tb': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey '
    '--seeds=5 --config.mesh.cpu_devices=1 --parallel=2 --points=mha': Run(
        subs=(('--seeds=5', '--seeds=2'),), extra=PASSKEY
    ),
    # the tiny runs' examples are 102 and 129 bytes long (PASSKEY), two seeds
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_calibration.csv '
    '--tag=eval/recall_accuracy,eval/recall_accuracy/depth0,eval/recall_accuracy/depth0.5,'
    'eval/recall_accuracy/depth1,eval/recall_accuracy/len128,eval/recall_accuracy/len257 '
    '--runs=mha_s0=runs/passkey/tb/mha_s0,mha_s1=runs/passkey/tb/mha_s1,'
    'mha_s2=runs/passkey/tb/mha_s2,mha_s3=runs/passkey/tb/mha_s3,'
    'mha_s4=runs/passkey/tb/mha_s4': Run(
        subs=(
            ('len128', 'len102'),
            ('len257', 'len129'),
            (
                ',mha_s2=runs/passkey/tb/mha_s2,mha_s3=runs/passkey/tb/mha_s3,'
                'mha_s4=runs/passkey/tb/mha_s4',
                '',
            ),
        )
    ),
    # the sweep of the variants: MHA's two seeds cached above, MQA's two runs (GQA-2 and MLA left
    # out: the same code path as MQA's and MHA's sweep points)
    'python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey '
    '--seeds=5 --config.mesh.cpu_devices=1 --parallel=2': Run(
        subs=(('--seeds=5', '--seeds=2'), ('--parallel=2', '--parallel=2 --points=mha,mqa')),
        extra=PASSKEY,
    ),
    'python scripts/sweep.py --config=configs/sweeps/passkey.py '
    '--sweep_dir=runs/passkey_mla_lr1e-3 --seeds=2 --config.mesh.cpu_devices=1 --parallel=2 '
    '--points=mla --config.train.lr=1e-3 --config.train.min_lr=1e-3': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/passkey.py '
    '--sweep_dir=runs/passkey_mha_lr1e-3 --seeds=2 --config.mesh.cpu_devices=1 --parallel=2 '
    '--points=mha --config.train.lr=1e-3 --config.train.min_lr=1e-3': Flags(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_lr1e-3.csv '
    '--runs=mla_s0=runs/passkey_mla_lr1e-3/tb/mla_s0,mla_s1=runs/passkey_mla_lr1e-3/tb/mla_s1,'
    'mha_s0=runs/passkey_mha_lr1e-3/tb/mha_s0,mha_s1=runs/passkey_mha_lr1e-3/tb/mha_s1': Flags(),
    # the sweep at 1e-3 reuses the screens' runs (flag-checked only, so nothing to copy here)
    'mkdir -p runs/passkey_lr1e-3/tb': REUSE_SCREENS,
    'for r in mla_s0 mla_s1; do cp -r runs/passkey_mla_lr1e-3/$r runs/passkey_lr1e-3/; '
    'cp -r runs/passkey_mla_lr1e-3/tb/$r runs/passkey_lr1e-3/tb/; done': REUSE_SCREENS,
    'for r in mha_s0 mha_s1; do cp -r runs/passkey_mha_lr1e-3/$r runs/passkey_lr1e-3/; '
    'cp -r runs/passkey_mha_lr1e-3/tb/$r runs/passkey_lr1e-3/tb/; done': REUSE_SCREENS,
    'python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey_lr1e-3 '
    '--seeds=5 --config.mesh.cpu_devices=1 --parallel=2 --config.train.lr=1e-3 '
    '--config.train.min_lr=1e-3': Flags(),
    'cp runs/passkey_lr1e-3/summary_seeds.csv docs/studies/recall/results/passkey_lr1e-3_seeds.csv': Skip(
        'the sweep at 1e-3 is only flag-checked'
    ),
    'python scripts/eval_sweep.py --sweep_dir=runs/passkey_lr1e-3 '
    '--config=configs/recall/passkey.py --config.data.recall_seed=1 '
    '--out=docs/studies/recall/results/passkey_lr1e-3_test.csv': Flags(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_lr1e-3_curves.csv '
    '--sweep_dir=runs/passkey_lr1e-3': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey_lr3e-4 '
    '--seeds=2 --config.mesh.cpu_devices=1 --parallel=2 --config.train.lr=3e-4 '
    '--config.train.min_lr=3e-4': Flags(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_lr3e-4_screen_curves.csv '
    '--runs=mha_s0=runs/passkey_lr3e-4/tb/mha_s0,mha_s1=runs/passkey_lr3e-4/tb/mha_s1'
    ',gqa2_s0=runs/passkey_lr3e-4/tb/gqa2_s0,gqa2_s1=runs/passkey_lr3e-4/tb/gqa2_s1,m'
    'qa_s0=runs/passkey_lr3e-4/tb/mqa_s0,mqa_s1=runs/passkey_lr3e-4/tb/mqa_s1,mla_s0='
    'runs/passkey_lr3e-4/tb/mla_s0,mla_s1=runs/passkey_lr3e-4/tb/mla_s1': Flags(),
    'python scripts/sweep.py --config=configs/sweeps/passkey.py --sweep_dir=runs/passkey_lr3e-4 '
    '--seeds=5 --points=mha,gqa2,mqa --config.mesh.cpu_devices=1 --parallel=2 '
    '--config.train.lr=3e-4 --config.train.min_lr=3e-4': Flags(),
    'python scripts/eval_sweep.py --sweep_dir=runs/passkey_lr3e-4 '
    '--config=configs/recall/passkey.py --config.data.recall_seed=1 '
    '--out=docs/studies/recall/results/passkey_lr3e-4_test.csv': Flags(),
    'python docs/studies/recall/lr_screen_csv.py --seeds=0,1,2,3,4 '
    '--choose_on=docs/studies/recall/results/passkey_lr_screen.csv --out=docs/studies/recall/results/passkey_chosen_test.csv '
    '--rates=1e-3=docs/studies/recall/results/passkey_lr1e-3_test.csv,'
    '3e-4=docs/studies/recall/results/passkey_lr3e-4_test.csv': Flags(),
    'cp runs/passkey_lr3e-4/summary_seeds.csv docs/studies/recall/results/passkey_lr3e-4_seeds.csv': Skip(
        "copies the 3e-4 sweep's summary; the tests only flag-check that sweep"
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_lr3e-4_curves.csv '
    '--sweep_dir=runs/passkey_lr3e-4': Flags(),
    # on the scaled-down passkey sweep run above, its own data sizes
    'python scripts/eval_sweep.py --sweep_dir=runs/passkey --config=configs/recall/passkey.py '
    '--config.data.recall_seed=1 --out=docs/studies/recall/results/passkey_test.csv': Run(extra=PASSKEY_DATA),
    'cp runs/passkey/summary_seeds.csv docs/studies/recall/results/passkey_seeds.csv': Run(),
    # the 3e-4 screen is only flag-checked: the scaled-down sweep above stands in for it
    'python docs/studies/recall/lr_screen_csv.py --seeds=0,1 --out=docs/studies/recall/results/passkey_lr_screen.csv '
    '--rates=3e-3=docs/studies/recall/results/passkey_seeds.csv,1e-3=docs/studies/recall/results/passkey_lr1e-3_seeds.csv,'
    '3e-4=runs/passkey_lr3e-4/summary_seeds.csv': Run(
        subs=(('runs/passkey_lr3e-4/summary_seeds.csv', 'runs/passkey/summary_seeds.csv'),)
    ),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_sweep_curves.csv '
    '--sweep_dir=runs/passkey': Run(),
    'python docs/studies/recall/curve_csv.py --out=docs/studies/recall/results/passkey_sweep_depths.csv '
    '--sweep_dir=runs/passkey --tag=eval/recall_accuracy,eval/recall_accuracy/depth0,'
    'eval/recall_accuracy/depth0.5,eval/recall_accuracy/depth1,eval/recall_accuracy/len128,'
    'eval/recall_accuracy/len257': Run(subs=(('len128', 'len102'), ('len257', 'len129'))),
    'python scripts/plot_pareto.py --run_dir=runs/passkey --metric=eval/recall_accuracy '
    '--out=docs/studies/recall/passkey_pareto.png': Run(),
    'python scripts/make_tables.py': Run(),
    # docs/studies/sweeps/README.md: the README's attention_kinds sweep at one seed again (all runs cached);
    # both run MHA and MLA only (GQA-4, GQA-2 and MQA are MHA's code path with fewer KV heads)
    'python scripts/sweep.py --config=configs/sweeps/attention_kinds.py --sweep_dir=runs/kinds5 '
    '--seeds=5': Run(
        subs=(('runs/kinds5', 'runs/kinds'), ('--seeds=5', '--seeds=1 --points=mha,mla'))
    ),
    'tensorboard --logdir runs/kinds5/tb': SERVER,
    'python scripts/plot_pareto.py --table=docs/studies/sweeps/results/pareto_reported.csv '
    '--out=docs/studies/sweeps/pareto_reported.png': Run(),
    'python scripts/sweep.py --config=configs/sweeps/attention_kinds.py '
    '--sweep_dir=runs/kinds5_params --seeds=5 --match=params --parallel=2': Flags(),
    # docs/studies/uptraining/README.md
    'python docs/studies/uptraining/mla_rope_selection.py --qk_rope_head_dim=8 '
    '--out=docs/studies/uptraining/results/rope_selection_mha.csv $(for s in 0 1 2 3 4; do echo '
    '--workdir=runs/passkey_lr3e-4/mha_s$s; done)': Flags(),
    'python docs/studies/uptraining/mla_rope_selection.py --qk_rope_head_dim=8 '
    '--out=docs/studies/uptraining/results/rope_selection_gqa2.csv $(for s in 0 1 2 3 4; do echo '
    '--workdir=runs/passkey_lr3e-4/gqa2_s$s; done)': Flags(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=1000 '
    '--seeds=5 --parallel=2 --out_dir=runs/uptrain1k_parts --schedule=continue,rewarm '
    '--methods=mean,aligned --targets=2,1 --mla_ranks=32 --fractions=0,0.05 '
    '--scratch_fractions=0.05 --lrs=3e-4,1e-3,3e-3,1e-2,3e-2 '
    '--report=runs/table_parts1k.md': Flags(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=1000 '
    '--seeds=5 --parallel=2 --out_dir=runs/uptrain1k_a0 --reuse=runs/uptrain1k_parts '
    '--methods=mean,aligned --targets=2,1 --mla_ranks=32 --fractions=0 --scratch_fractions=0 '
    '--lrs=3e-4,1e-3,3e-3,1e-2,3e-2 --report=runs/table_a0.md': Flags(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=1000 '
    '--seeds=5 --parallel=3 --out_dir=runs/uptrain1k_a01 --reuse=runs/uptrain1k_parts '
    '--schedule=continue,rewarm --methods=mean,aligned --targets=2,1 --mla_ranks=32 '
    '--fractions=0.1 --scratch_fractions=0.1 --lrs=1e-3,3e-3,1e-2 '
    '--report=runs/table_a01.md': Flags(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=1000 '
    '--seeds=5 --parallel=2 --out_dir=runs/uptrain1k_mla_keys --schedule=continue,rewarm '
    '--targets= --mla_ranks=32 --mla_rope_heads=1,4 --fractions=0,0.05 --scratch_fractions= '
    '--lrs=1e-3,3e-3,1e-2 --report=runs/table_mla_keys.md': Flags(),
    'python scripts/uptrain_ablation.py --data_path=data/tinyshakespeare.txt --steps=5000 '
    '--seeds=5 --parallel=2 --out_dir=runs/uptrain5k_parts --schedule=continue,rewarm '
    '--methods=mean,aligned,first,random --targets=2,1 --mla_ranks=32,64 '
    '--fractions=0,0.05,0.1 --lrs=3e-4,1e-3,3e-3 --report=runs/table_parts.md': Flags(),
    'COMMON="--data_path=data/tinyshakespeare.txt --steps=5000 --seeds=5 --parallel=2"': Run(),
    'python scripts/uptrain_ablation.py $COMMON --out_dir=runs/uptrain5k_continue '
    '--methods=mean,similarity-mean,aligned,first,random --fractions=0,0.05 '
    '--scratch_fractions=0.05 --targets=2,1 --report=runs/table_methods.md': Flags(),
    'python scripts/uptrain_ablation.py $COMMON --out_dir=runs/uptrain5k_continue --targets= '
    '--mla_ranks=32,64 --fractions=0,0.05 --scratch_fractions= '
    '--report=runs/table_mla.md': Flags(),
    'python scripts/uptrain_ablation.py $COMMON --out_dir=runs/uptrain5k_continue '
    '--methods=mean,first,random --fractions=0,0.05,0.1 --scratch_fractions=0.05 '
    '--targets=2,1 --report=runs/table_continue.md': Flags(),
    'python scripts/uptrain_ablation.py $COMMON --out_dir=runs/uptrain5k_rewarm '
    '--schedule=rewarm --reuse=runs/uptrain5k_continue --methods=mean,first,random '
    '--fractions=0.05 --scratch_fractions=0.05 --targets=2,1 '
    '--compare_with=runs/uptrain5k_continue --report=runs/table_rewarm.md': Flags(),
    'python scripts/uptrain.py --src=runs/mha --dst=runs/gqa2_sim_al --num_kv_heads=2 '
    '--grouping=similarity --method=aligned': Run(subs=(('runs/mha', 'runs/shakespeare_mha'),)),
    'python scripts/uptrain.py --src=runs/mha --dst=runs/mla64 --target=mla --kv_lora_rank=64 '
    '--qk_rope_head_dim=8 --optimizer_state=fresh': Run(
        subs=(  # the tiny source's heads are 8 wide
            ('runs/mha', 'runs/shakespeare_mha'),
            ('--kv_lora_rank=64', '--kv_lora_rank=16'),
            ('--qk_rope_head_dim=8', '--qk_rope_head_dim=4'),
        )
    ),
    # --rope_heads end to end: tests/test_uptrain.py (test_uptrain_end_to_end)
    'python scripts/uptrain.py --src=runs/mha --dst=runs/mla64_k4 --target=mla --kv_lora_rank=64 '
    '--qk_rope_head_dim=8 --rope_heads=4 --optimizer_state=fresh': Flags(),
}


def doc_commands(text: str) -> list[str]:
    """The commands of a document's bash blocks: continuation lines joined, comments and blank
    lines dropped, runs of spaces made one, a multi-line `for` loop kept whole."""
    out = []
    for block in re.findall(r'```bash\n(.*?)```', text, flags=re.S):
        lines = []
        for line in block.replace('\\\n', ' ').splitlines():
            line = re.sub(r'\s+#\s.*$', '', line).strip()
            if line and not line.startswith('#'):
                lines.append(' '.join(line.split()))
        i = 0
        while i < len(lines):
            j = i
            if lines[i].startswith('for ') and 'done' not in lines[i]:
                j = lines.index('done', i)
            out.append('\n'.join(lines[i : j + 1]))
            i = j + 1
    return out


def all_commands() -> list[tuple[str, str]]:
    return [(doc, c) for doc in DOCS for c in doc_commands((ROOT / doc).read_text())]


def scaled(command: str, action: Run | Flags) -> str:
    """The command as the test runs it: substituted, TINY / extra appended (Run), or each python
    command ended by --help (Flags)."""
    for old, new in action.subs:
        assert old in command, (old, command)
        command = command.replace(old, new)
    if isinstance(action, Flags):
        parts = re.split(r'(\s*(?:&&|;|&|\n)\s*)', command)
        return ''.join(p + ' --help' if 'python ' in p else p for p in parts)
    lines = []
    for line in command.split('\n'):
        if re.match(r'python (train|scripts/sweep)\.py --config', line):
            line += ' ' + TINY
        lines.append(line)
    return '\n'.join(lines) + (f' {action.extra}' if action.extra else '')


def scratch(tmp_path):
    """A directory that looks like the repository to the commands (entry points and scripts
    linked in, configs copied), with `python` on PATH and the data files the commands read."""
    for name in ('train.py', 'eval.py', 'scripts'):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / 'configs', tmp_path / 'configs')  # their '..' paths stay in here
    # docs/ without what the commands make: the figures and the CSVs of MADE
    shutil.copytree(ROOT / 'docs', tmp_path / 'docs', ignore=shutil.ignore_patterns(*MADE))
    (tmp_path / 'bin').mkdir()
    (tmp_path / 'bin' / 'python').symlink_to(sys.executable)
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'tinyshakespeare.txt').write_text(stdlib_text(60_000), encoding='utf-8')
    (tmp_path / 'other.txt').write_text(stdlib_text(20_000), encoding='utf-8')
    (tmp_path / 'prompts.txt').write_text('ROMEO:\nJULIET:\n', encoding='utf-8')
    env = {**os.environ, 'JAX_PLATFORMS': 'cpu', 'PYTHONPATH': str(ROOT), 'RANK': '0'}
    env['PATH'] = f'{tmp_path / "bin"}{os.pathsep}{env["PATH"]}'
    return env


def bash(command: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ['bash', '-c', command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


# Chains of Run commands that share no files: docs/studies/recall/README.md trains its own runs from scratch.
# Only its chain writes the recall CSVs (MADE), so `make_tables.py` in another doc's bash block
# fails in the main chain: other docs name it in prose.
CHAINS = {'recall': ['docs/studies/recall/README.md']}
CHAINS['main'] = [doc for doc in DOCS if doc not in CHAINS['recall']]


def walk(docs: list[str]):
    """(document, command, action, shell variables set before it in its document) for every
    planned command of `docs`, each document's commands once, Skip and variable lines left out."""
    for doc in docs:
        shell_vars, seen = '', set()
        for command in doc_commands((ROOT / doc).read_text()):
            action = PLAN[command]
            if isinstance(action, Skip) or command in seen:
                continue
            seen.add(command)
            if re.match(r'^[A-Z_][A-Z0-9_]*=', command):  # a variable later lines use
                shell_vars += scaled(command, action) + '\n'
                continue
            yield doc, command, action, shell_vars


def run_chain(chain: str, tmp_path) -> None:
    """Runs the chain's Run commands in order in a scratch directory; fails on the first error."""
    env = scratch(tmp_path)
    for doc, command, action, shell_vars in walk(CHAINS[chain]):
        if isinstance(action, Run):
            out = bash(shell_vars + scaled(command, action), tmp_path, env)
            assert out.returncode == 0, (
                f'{doc}: {command}\n{out.stdout[-2000:]}{out.stderr[-4000:]}'
            )
