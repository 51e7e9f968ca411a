"""Data-path throughput: tokenisation MB/s (serial vs a worker pool, byte and BPE tokenizers)
with peak memory, and loader batches/s at the configs/gpt125m.py shape against what a step needs.

The text is public and on every machine: this Python's standard-library .py files (the
`stdlib` source's order), concatenated and repeated until the file holds --make_mb MB. BPE is a
byte-level BPE of --bpe_vocab ids trained here on the file's first 8 MB. Each (tokenizer,
processes) point builds a fresh cache (`lm.data.corpus.load_corpus`, source 'text') in its own
spawned
process, so its peak RSS (VmHWM) is its own (the largest pool worker's is ru_maxrss of the
waited children, an upper bound); the time includes the hashing / UTF-8 pass that precedes
tokenisation (what a run waits for). Every pooled cache is checked to be byte-identical to the
serial one. The loader is `lm.data.windows.call_batch` (what the training loop's batch thread runs)
on the byte cache, median of --repeats timings of --batches batches.

  python scripts/bench_data.py                   # the tables of docs/studies/data/README.md
  python scripts/bench_data.py --make_mb=64 --num_proc=1,2      # a quick look
"""

import hashlib
import json
import multiprocessing
import os
import resource
import statistics
import tempfile
import time

from absl import flags

from lm.config import load_config_file
from lm.data import call_batch, load_corpus, stdlib_files, train_bpe

_MAKE_MB = flags.DEFINE_integer('make_mb', 1024, 'Size of the repeated stdlib text file in MB.')
_TEXT = flags.DEFINE_string('text', '', 'Use this text file instead of making one.')
_WORKDIR = flags.DEFINE_string('workdir', '', "Where the text and caches go; '' = a temp dir.")
_TOKENIZERS = flags.DEFINE_list('tokenizers', ['byte', 'bpe'], 'Tokenizers to measure.')
_NUM_PROC = flags.DEFINE_list(
    'num_proc', ['1', str(os.cpu_count() or 1)], 'Tokenisation processes (config.data.num_proc).'
)
_BPE_VOCAB = flags.DEFINE_integer('bpe_vocab', 4096, 'BPE vocabulary size.')
_BATCHES = flags.DEFINE_integer('batches', 50, 'Loader batches per timing.')
_REPEATS = flags.DEFINE_integer('repeats', 5, 'Loader timings per sampling (median reported).')
_DEVICE = flags.DEFINE_string('device', 'NVIDIA H100', 'Accelerator whose step rate is needed.')
_MFU = flags.DEFINE_float('mfu', 0.4, 'Model FLOP utilisation assumed for that step rate.')
_JSON = flags.DEFINE_string('json', '', 'Also write the rows as JSON here.')

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MB = 1e6


def make_text(path: str, megabytes: int) -> None:
    """The stdlib .py files, concatenated and repeated to `megabytes` MB (the last copy cut at a
    character, so the file is that size less at most 3 bytes)."""
    texts = []
    for _, full in stdlib_files():
        with open(full, encoding='utf-8', errors='replace') as f:
            texts.append(f.read())
    block = ''.join(texts).encode('utf-8')
    target = int(megabytes * MB)
    with open(path, 'wb') as f:
        for start in range(0, target, len(block)):
            piece = block[: target - start]
            f.write(piece.decode('utf-8', 'ignore').encode('utf-8'))  # a split character dropped


def _train_bpe(text_path: str, vocab: int, path: str) -> None:
    with open(text_path, encoding='utf-8', errors='replace') as f:
        sample = f.read(8_000_000)
    train_bpe(iter([sample]), vocab, path)


def bpe_file(text_path: str, directory: str) -> str:
    """A BPE trained on the text's first 8 MB, in a spawned process (its memory stays there)."""
    path = os.path.join(directory, f'bpe-{_BPE_VOCAB.value}.json')
    if not os.path.isfile(path):
        proc = multiprocessing.get_context('spawn').Process(
            target=_train_bpe, args=(text_path, _BPE_VOCAB.value, path)
        )
        proc.start()
        proc.join()
    return path


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM: unlike ru_maxrss, not inherited)."""
    with open('/proc/self/status') as f:
        for line in f:
            if line.startswith('VmHWM:'):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def data_config(text_path: str, tokenizer: str, num_proc: int, cache: str):
    data = load_config_file(os.path.join(ROOT, 'configs', 'base.py')).data
    data.update(
        source='text', path=text_path, tokenizer=tokenizer, num_proc=num_proc, cache_dir=cache
    )
    return data


def _measure(data_dict: dict, results) -> None:
    """Runs in a spawned process: one cache build, its time and peak memory."""
    import ml_collections

    baseline = peak_rss_mb()
    t = time.perf_counter()
    corpus = load_corpus(ml_collections.ConfigDict(data_dict))
    seconds = time.perf_counter() - t
    peak = peak_rss_mb()  # before the check below reads the cache into memory
    digest = hashlib.sha256()
    for split in ('train', 'validation'):
        tokens = corpus.tokens[split]
        for first in range(0, len(tokens), 1 << 24):
            digest.update(tokens[first : first + (1 << 24)].tobytes())
    results.put(
        {
            'seconds': seconds,
            'tokens': sum(len(t) for t in corpus.tokens.values()),
            'baseline_rss_mb': baseline,
            'builder_rss_mb': peak,
            'worker_rss_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
            'sha256': digest.hexdigest(),
        }
    )


def tokenise_rows(text_path: str, directory: str) -> list[dict]:
    context = multiprocessing.get_context('spawn')
    size_mb = os.path.getsize(text_path) / MB
    rows = []
    for name in _TOKENIZERS.value:
        tokenizer = bpe_file(text_path, directory) if name == 'bpe' else name
        serial = None
        for n in map(int, _NUM_PROC.value):
            cache = tempfile.mkdtemp(prefix=f'cache-{name}-{n}-', dir=directory)
            results = context.Queue()
            data = data_config(text_path, tokenizer, n, cache).to_dict()
            proc = context.Process(target=_measure, args=(data, results))
            proc.start()
            row = results.get()
            proc.join()
            serial = serial or row['sha256']
            row.update(
                tokenizer=name,
                processes=n,
                mb=size_mb,
                mb_per_s=size_mb / row['seconds'],
                mb_per_s_per_process=size_mb / row['seconds'] / n,
                same_as_first=row['sha256'] == serial,
            )
            rows.append(row)
            print(
                f'| {name} | {n} | {size_mb:,.0f} | {row["seconds"]:.1f} | '
                f'{row["mb_per_s"]:.1f} | {row["mb_per_s_per_process"]:.1f} | '
                f'{row["baseline_rss_mb"]:.0f} | {row["builder_rss_mb"]:.0f} | '
                f'{row["worker_rss_mb"]:.0f} | '
                f'{"yes" if row["same_as_first"] else "NO"} |',
                flush=True,
            )
    return rows


def loader_rows(text_path: str, directory: str) -> list[dict]:
    # imported here: the spawned build processes import this file, and their peak memory
    # should not include JAX
    from lm.model import flops_per_token, model_config
    from lm.train import PEAK_FLOPS

    config = load_config_file(os.path.join(ROOT, 'configs', 'gpt125m.py'))
    B, T = config.train.batch_size, config.data.seq_len
    cfg = model_config(config.model, 258)
    step_flops = flops_per_token(cfg, T) * B * T  # training FLOPs (PaLM App. B)
    need = _MFU.value * PEAK_FLOPS[_DEVICE.value] / step_flops  # steps/s
    data = data_config(text_path, 'byte', 1, os.path.join(directory, 'loader-cache'))
    tokens = load_corpus(data).tokens['train']
    rows = []
    for sampling in ('random', 'epochs'):
        times = []
        for r in range(_REPEATS.value):
            t = time.perf_counter()
            for i in range(_BATCHES.value):
                step = r * _BATCHES.value + i
                call_batch(
                    tokens, seed=0, step=step, steps=1, batch_size=B, seq_len=T, sampling=sampling
                )
            times.append(time.perf_counter() - t)
        per_s = _BATCHES.value / statistics.median(times)
        rows.append(
            {
                'sampling': sampling,
                'batch': B,
                'seq_len': T,
                'batches_per_s': per_s,
                'steps_per_s_needed': need,
            }
        )
        print(f'| {sampling} | {B} x {T} | {per_s:,.1f} | {need:,.2f} | {per_s / need:,.0f}x |')
    return rows


def check_flags() -> None:
    """One line for a flag the run would fail on after its tokenising (minutes for 1 GB)."""
    from lm.train import PEAK_FLOPS

    if _DEVICE.value not in PEAK_FLOPS:
        raise ValueError(f'--device={_DEVICE.value!r}: expected one of {sorted(PEAK_FLOPS)}')
    if not 0 < _MFU.value <= 1:
        raise ValueError(f'--mfu must be in (0, 1] (a fraction of the peak), got {_MFU.value}')
    for flag in (_REPEATS, _BATCHES, _BPE_VOCAB):
        if flag.value < 1:
            raise ValueError(f'--{flag.name} must be >= 1, got {flag.value}')
    bad = [n for n in _NUM_PROC.value if not n.isdigit() or int(n) < 1]
    if bad or not _NUM_PROC.value:
        raise ValueError(f'--num_proc: expected process counts >= 1 (1,2), got {_NUM_PROC.value}')


def main() -> None:
    from lm.cli import check_writable_dir
    from lm.experiments import check_output_path

    if not _TEXT.value and _MAKE_MB.value < 1:
        raise ValueError(f'--make_mb must be >= 1 (MB of text to make), got {_MAKE_MB.value}')
    check_flags()
    if _JSON.value:
        check_output_path(_JSON.value, '--json', '.json')
        check_writable_dir(os.path.dirname(os.path.abspath(_JSON.value)), '--json')
    if _WORKDIR.value:
        check_writable_dir(_WORKDIR.value, '--workdir')
    directory = _WORKDIR.value or tempfile.mkdtemp(prefix='bench_data-')
    os.makedirs(directory, exist_ok=True)
    text_path = _TEXT.value or os.path.join(directory, f'stdlib-{_MAKE_MB.value}mb.txt')
    if not _TEXT.value and not os.path.isfile(text_path):
        make_text(text_path, _MAKE_MB.value)
    from lm.train import cpu_model

    print(f'{cpu_model()}, {time.strftime("%Y-%m-%d")}; text {text_path}\n')
    print(
        '| tokenizer | processes | MB | seconds | MB/s | MB/s per process | RSS before build MB '
        '| peak RSS builder MB | peak RSS worker MB | cache identical to first row |'
    )
    print('|---|---|---|---|---|---|---|---|---|---|')
    rows = tokenise_rows(text_path, directory)
    print(
        f'\nloader: lm.data.windows.call_batch, median of {_REPEATS.value} x {_BATCHES.value} '
        f'batches; step rate of a {_DEVICE.value} at {_MFU.value:.0%} MFU (gpt125m)\n'
    )
    print('| sampling | batch | batches/s | steps/s needed | headroom |')
    print('|---|---|---|---|---|')
    rows += loader_rows(text_path, directory)
    if _JSON.value:
        with open(_JSON.value, 'w') as f:
            json.dump(rows, f, indent=1)


if __name__ == '__main__':
    from lm.cli import run_app  # imports JAX, which the spawned build processes do without

    run_app(main)
