"""scripts/generate.py and the parameter-only restores of inference: the context is the model's
maximum position, over-long requests are refused before any work, one prompt streams, SIGTERM
stops within seconds, non-finite parameters are refused, and peak memory follows the parameter
bytes (no optimizer state is read)."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import ENV, ROOT, run_entry, tiny_config
from flax import nnx

from lm.convert.hf_io import export_hf
from lm.convert.options import ConversionOptions
from lm.convert.uptrain import convert_checkpoint
from lm.data.tokenizer import HFTokenizer
from lm.train.checkpoint import Checkpointer
from lm.train.run import assemble
from lm.train.stored import checkpoint_meta

TOKENIZER = ROOT / 'tests' / 'fixtures' / 'hf' / 'llama_mha' / 'tokenizer.json'
GENERATE = 'scripts/generate.py'
DIVIDER = '-' * 40


def write_run(workdir, d_model, seq_len, nan_in=None, tokenizer=TOKENIZER):
    """A step-0 run (GQA, 4 layers, the fixture's word-level tokenizer) saved with its optimizer
    state, as training saves; `nan_in`: a parameter path given one NaN element."""
    config = tiny_config(
        attention='gqa',
        num_kv_heads=2,
        d_model=d_model,
        num_layers=4,
        num_heads=8,
        mlp_dim=3 * d_model,
    )
    config.data.update(tokenizer=str(tokenizer), eos_token='</s>', seq_len=seq_len)
    run = assemble(config, state='init')
    state = run.state
    if nan_in is not None:
        node = state['params']
        *parents, leaf = nan_in.split('/')
        for key in parents:
            node = node[int(key) if key.isdigit() and int(key) in node else key]
        node[leaf] = node[leaf].at[(0,) * node[leaf].ndim].set(np.nan)
    ckpt = Checkpointer(str(workdir), async_save=False)
    ckpt.save(0, state, checkpoint_meta(run.config, 'test', 0, run.ctx.abstract_state['params']))
    ckpt.close()
    return run.config


@pytest.fixture(scope='module')
def tiny_run(tmp_path_factory):
    """A tiny run whose context (data.seq_len, no imported maximum) is 32 positions."""
    workdir = tmp_path_factory.mktemp('gen') / 'tiny'
    write_run(workdir, d_model=64, seq_len=32)
    return workdir


@pytest.mark.slow
def test_a_tokenizer_file_edited_after_training_is_refused(tmp_path):
    """The checkpoint records its tokenizer.json's sha256: generation, evaluation, export and
    resuming refuse the file once its bytes change (it would give other ids silently)."""
    from lm.train.stored import stored_config

    tokenizer = tmp_path / 'tokenizer.json'
    shutil.copy(TOKENIZER, tokenizer)
    write_run(tmp_path / 'run', d_model=32, seq_len=16, tokenizer=tokenizer)
    assert stored_config(str(tmp_path / 'run')).data.tokenizer == str(tokenizer)
    vocab = json.loads(tokenizer.read_text())
    words = vocab['model']['vocab']
    a, b = list(words)[5:7]
    words[a], words[b] = words[b], words[a]  # two ids swapped
    tokenizer.write_text(json.dumps(vocab))
    with pytest.raises(
        ValueError,
        match=rf"^--workdir={tmp_path / 'run'}: config\.data\.tokenizer='{tokenizer}' changed "
        r'since the run trained with it \(sha256 \w{12}, recorded \w{12}\); the checkpoint',
    ):
        stored_config(str(tmp_path / 'run'))


def greedy_reference(workdir, prompt_ids, n):
    """n greedy tokens by full forward passes over the whole sequence (no cache). Each pass runs
    on the sequence right-padded to its final length (one compile): causal attention keeps the
    padding out of the logits read at the last real position."""
    run = assemble(str(workdir), state='params')
    graphdef, params = run.ctx.graphdef, run.state['params']
    forward = jax.jit(lambda x: nnx.merge(graphdef, params)(x))
    tokens = np.zeros((1, len(prompt_ids) + n), np.int32)
    tokens[0, : len(prompt_ids)] = prompt_ids
    for t in range(len(prompt_ids), tokens.shape[1]):
        tokens[0, t] = int(np.argmax(forward(jnp.asarray(tokens))[0, t - 1]))
    return tokens[0, len(prompt_ids) :].tolist()


@pytest.mark.slow
def test_generate_prints_the_greedy_continuation_of_a_full_forward(tiny_run):
    """One prompt, streamed: stdout is the prompt and the text of the greedy tokens a cache-free
    reference picks, over 28 new tokens (up to the 32-position context: one loop, no chunks
    conditioned on a window; what --max_new_tokens is when not given)."""
    tokenizer = HFTokenizer.from_file(str(TOKENIZER), '</s>')
    prompt = 'the cat sat on'
    ids = tokenizer.encode(prompt)
    n = 32 - len(ids)
    want = prompt + tokenizer.decode(greedy_reference(tiny_run, ids, n))
    out = run_entry(
        GENERATE,
        f'--workdir={tiny_run}',
        f'--prompt={prompt}',
        '--sampling=greedy',
        '--nostop_at_eos',
        check=True,
    )
    assert out.stdout == f'{want}\n{DIVIDER}\n'


@pytest.mark.slow
def test_generate_on_a_recall_run_prints_prompt_and_continuation_apart(tmp_path):
    """An MQAR run's ids: the prompt, ' =>', then the new ids, each apart ('1 40 => 23 59 46',
    not '1 4023 59 46')."""
    config = tiny_config(attention='mha', vocab_size=64)
    config.data.update(source='mqar', recall_pairs=4, recall_vocab=64, seq_len=32)
    run = assemble(config, state='init')
    ckpt = Checkpointer(str(tmp_path / 'mqar'), async_save=False)
    ckpt.save(
        0, run.state, checkpoint_meta(run.config, 'test', 0, run.ctx.abstract_state['params'])
    )
    ckpt.close()
    out = run_entry(
        GENERATE,
        f'--workdir={tmp_path / "mqar"}',
        '--prompt=1 40',
        '--max_new_tokens=3',
        '--sampling=greedy',
        '--nostop_at_eos',
        check=True,
    )
    assert re.fullmatch(rf'1 40 => \d+ \d+ \d+\n{DIVIDER}\n', out.stdout), out.stdout


@pytest.mark.slow
def test_generate_refuses_what_does_not_fit_the_context_before_any_work(tiny_run, tmp_path):
    """A prompt longer than the context, a prompt + --max_new_tokens beyond it: one line each,
    naming the prompt / the flag and the limit (the checkpoint is not read: a corrupt state
    would fail otherwise). Prompts come from --prompt and --prompts_file."""
    long_prompt = 'the ' * 10  # 40 tokens (the fixture's tokens are letters and pairs)
    prompts = tmp_path / 'prompts.txt'
    prompts.write_text(f'a cat\n\n{long_prompt}\n', encoding='utf-8')
    with_bom = tmp_path / 'bom.txt'  # as some editors save UTF-8: the BOM is not the prompt's
    with_bom.write_bytes(b'\xef\xbb\xbf' + long_prompt.encode() + b'\r\n')
    cases = [
        (
            [f'--prompt={long_prompt}'],
            "error: prompt 1 ('the the the the the the the th...') is 40 tokens, longer than "
            "the model's context of 32 positions: no new token fits",
        ),
        (
            [f'--prompt={long_prompt[:32]}'],  # the whole context: the default count cannot fit
            "error: prompt 1 ('the the the the the the the th...') is 32 tokens, as long as "
            "the model's context of 32 positions: no new token fits",
        ),
        (
            ['--prompt=the', f'--prompts_file={prompts}'],
            "error: prompt 3 ('the the the the the the the th...') is 40 tokens, longer than "
            "the model's context of 32 positions: no new token fits",
        ),
        (
            ['--prompt=the', f'--prompts_file={with_bom}'],
            "error: prompt 2 ('the the the the the the the th...') is 40 tokens, longer than "
            "the model's context of 32 positions: no new token fits",
        ),
        (
            ['--prompt=the cat', '--max_new_tokens=31'],
            'error: --max_new_tokens=31: the longest prompt (7 tokens) plus 31 new tokens exceed '
            "the model's context of 32 positions; at most 25 new tokens fit",
        ),
        (
            ['--prompt=the', '--prompt='],
            "error: prompt 2 ('') is no tokens: every prompt needs at least one (with no "
            "--prompt at all, the prompt is '\\n')",
        ),
    ]
    for args, message in cases:
        out = run_entry(GENERATE, f'--workdir={tiny_run}', *args)
        assert out.returncode == 1, out.stdout[-500:]
        assert out.stderr.strip().splitlines()[-1] == message
        assert not out.stdout


@pytest.mark.slow
@pytest.mark.parametrize('d_model', [128, 64])
def test_generate_with_the_fused_decode_kernel_prints_the_same_greedy_text(tmp_path, d_model):
    """--decode_kernel=pallas_interpret (lm/model/flash_decode.py in Pallas's interpreter, as a
    GPU would run it compiled): the greedy text of a cache-free reference, on 8 heads of 16 and
    of 8 (a width narrower than a Triton matrix tile, read by elementwise products)."""
    workdir = tmp_path / f'd{d_model}'
    write_run(workdir, d_model=d_model, seq_len=32)
    tokenizer = HFTokenizer.from_file(str(TOKENIZER), '</s>')
    prompt = 'the cat'
    ids = tokenizer.encode(prompt)
    want = prompt + tokenizer.decode(greedy_reference(workdir, ids, 6))
    args = ['--sampling=greedy', '--nostop_at_eos', '--decode_kernel=pallas_interpret']
    out = run_entry(
        GENERATE, f'--workdir={workdir}', f'--prompt={prompt}', '--max_new_tokens=6', *args
    )
    assert out.stdout == f'{want}\n{DIVIDER}\n', out.stderr[-2000:]


@pytest.mark.slow
def test_non_finite_parameters_are_refused_naming_the_first(tmp_path):
    """generate.py, export and uptrain refuse a checkpoint holding a NaN, naming the parameter
    (eval.py refuses the non-finite loss it gives: tests/test_evaluation.py)."""
    workdir = tmp_path / 'nan'
    write_run(workdir, d_model=64, seq_len=32, nan_in='blocks/2/mlp/up_proj/kernel')
    message = 'holds non-finite parameters (NaN or inf), first in blocks/2/mlp/up_proj/kernel'
    out = run_entry(GENERATE, f'--workdir={workdir}', '--prompt=the', '--max_new_tokens=2')
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f'error: --workdir={workdir}: the checkpoint at step 0 {message}; refusing to use them'
    )
    with pytest.raises(FloatingPointError, match=re.escape(message)):
        export_hf(str(workdir), str(tmp_path / 'hf'))
    assert not (tmp_path / 'hf').exists()
    with pytest.raises(FloatingPointError, match=re.escape(message)):
        options = ConversionOptions(num_kv_heads=1, steps=2)
        convert_checkpoint(str(workdir), options, str(tmp_path / 'up'))
    assert not (tmp_path / 'up' / 'checkpoints').exists()


def peak_rss_mb(args: list[str]) -> float:
    """Peak RSS (MiB) of `python args` run from the repository root, measured by a wrapper
    process whose only child it is (RUSAGE_CHILDREN of this process would include every
    earlier subprocess)."""
    wrapper = (
        'import resource, subprocess, sys; '
        'r = subprocess.run(sys.argv[1:], capture_output=True, text=True); '
        'sys.stderr.write(r.stderr[-2000:]); '
        'print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)'
    )
    out = subprocess.run(
        [sys.executable, '-c', wrapper, sys.executable, *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )
    code, kib = out.stdout.split()
    assert code == '0', out.stderr[-2000:]
    return int(kib) / 1024


@pytest.mark.slow
def test_peak_memory_of_generate_and_import_follows_the_parameter_bytes(tmp_path):
    """generate.py and the HF import read no optimizer state: on a 4-layer model of P = 46 MiB
    of float32 parameters, generate's peak RSS over the runtime's baseline (the same command on
    a 0.7 MiB model of the same architecture: imports, orbax, compiling the same loop) is at
    most 4·P (measured 1.7-2.2·P here, 3.05·P once on CI: the baseline alone varies by ~25 MiB
    between launches; reading the optimizer state too gave ~8·P), and the import's is at most
    4× the safetensors file (measured 2.3-2.4×; ~9× when it built an optimizer state)."""
    runs = {}
    for name, d_model in (('small', 64), ('big', 512)):
        runs[name] = tmp_path / name
        write_run(runs[name], d_model=d_model, seq_len=64)
        export_hf(str(runs[name]), str(tmp_path / f'{name}_hf'))
    P = sum(x.nbytes for x in jax.tree.leaves(assemble(str(runs['big']), state='params').state))
    P /= 2**20
    generate = ['--prompt=the', '--max_new_tokens=8', '--sampling=greedy']
    peaks = {n: peak_rss_mb([GENERATE, f'--workdir={w}', *generate]) for n, w in runs.items()}
    assert peaks['big'] - peaks['small'] <= 4 * P, (peaks, P)
    imports = {
        name: peak_rss_mb(
            [
                'scripts/convert_hf.py',
                'import',
                f'--hf_dir={tmp_path / f"{name}_hf"}',
                f'--workdir={tmp_path / f"{name}_import"}',
            ]
        )
        for name in runs
    }
    file_mb = os.path.getsize(tmp_path / 'big_hf' / 'model.safetensors') / 2**20
    assert imports['big'] - imports['small'] <= 4 * file_mb, (imports, file_mb)


@pytest.mark.slow
def test_generate_streams_and_stops_on_sigterm_with_exit_143(tmp_path):
    """An imported run's context is its config.json max_position_embeddings (4096 here, not the
    import config's data.seq_len = 256). A long generation streams its text as it is made; a
    SIGTERM then stops it within seconds with one line and exit 143."""
    write_run(tmp_path / 'run', d_model=256, seq_len=4096)
    export_hf(str(tmp_path / 'run'), str(tmp_path / 'hf'))
    imported = tmp_path / 'imported'
    run_entry(
        'scripts/convert_hf.py', 'import', f'--hf_dir={tmp_path / "hf"}', f'--workdir={imported}'
    )
    assert run_entry(  # longer than data.seq_len = 256: accepted
        GENERATE, f'--workdir={imported}', '--prompt=the', '--max_new_tokens=300', check=True
    ).stdout.startswith('the')
    refused = run_entry(GENERATE, f'--workdir={imported}', '--prompt=the', '--max_new_tokens=4096')
    assert refused.stderr.strip().splitlines()[-1].endswith('at most 4093 new tokens fit')
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / GENERATE),
            f'--workdir={imported}',
            '--prompt=the',
            '--max_new_tokens=4000',
            '--nostop_at_eos',
        ],
        cwd=ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        streamed = proc.stdout.read(len('the') + 8)  # the prompt and a few tokens' text
        assert streamed.startswith('the') and len(streamed) > len('the')
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
        elapsed = time.monotonic() - sent
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, stderr[-2000:]
    assert stderr.strip().splitlines()[-1].startswith('stopped by SIGTERM;')
    assert elapsed < 10, elapsed
