r"""Does this checkout train as the recorded one did? Trains each golden case (below) for a few
steps from its initialisation on the CPU (`lm.train.golden_run`) and compares each step's loss
and gradient norm, bit for bit, the parameters reached and their validation loss with the
record, tests/fixtures/golden_runs.json.

  python scripts/golden_run.py            # compare; exit 1 if any case differs
  python scripts/golden_run.py --write    # record this checkout (after a change you mean)
  python scripts/golden_run.py --cases=mqar_mla   # only these cases (comma-separated)

Under the record's toolchain (JAX, jaxlib, backend, CPU model, XLA's optimisation and the
CPU-side XLA_FLAGS) a golden run must match exactly; under another one its losses must agree to
lm.train.golden's TOOLCHAIN_RTOL (last bits may move, the computation may not). A change that is
meant (a rewritten backward pass, say) is recorded with --write and a line in docs/train.md's
golden-run log, so that a study's reruns can be told apart from its runs.
"""

import datetime
import json
import os
import re
import tempfile

import jax
from absl import flags

from lm.cli import run_app
from lm.config import load_config_file, with_values
from lm.experiments import check_output_file
from lm.sharding import set_cpu_devices
from lm.train import (
    TOOLCHAIN_RTOL,
    compare_golden,
    differences,
    golden_run,
    source_commit,
    toolchain,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# name: (config spec, overrides). Each covers a path the studies train through: the KV-sharing
# studies' character-level text in a looped ensemble (on `golden_text()`, written to a scratch
# directory: '{scratch}'), the MQAR study's looped ensemble of GQA, MLA's latent attention, and
# gradient accumulation with several steps per call (recall data is generated from seeds).
CASES = {
    'text_mqa_ensemble': (
        'configs/shakespeare_char.py:mqa',
        {
            'data.path': '{scratch}/golden.txt',
            'data.cache_dir': '{scratch}/cache',
            'train.ensemble': 2,
            'train.ensemble_loop': True,
        },
    ),
    'mqar_gqa2_ensemble': (
        'configs/recall/mqar_zoology.py:gqa2',
        {'train.ensemble': 2, 'train.ensemble_loop': True},
    ),
    'mqar_mla': ('configs/recall/mqar_zoology.py:mla', {}),
    'mqar_mqa_accumulated': (
        'configs/recall/mqar.py:mqa',
        {'train.grad_accum_steps': 2, 'train.steps_per_call': 4},
    ),
}
STEPS = 8  # optimizer steps per case
# one CPU device (no cross-device reduction order to vary); a 2-step warmup, so that the 8 steps
# train at the recipe's rate rather than at a few percent of it
COMMON = {'mesh.cpu_devices': 1, 'train.warmup_steps': 2}

_RECORD = flags.DEFINE_string(
    'record', os.path.join(ROOT, 'tests', 'fixtures', 'golden_runs.json'), 'The record (JSON).'
)
_WRITE = flags.DEFINE_bool('write', False, "Write this checkout's golden runs as the record.")
_CASES = flags.DEFINE_list('cases', None, 'Compare only these cases (default: every case).')


def golden_text(words: int = 12_000) -> str:
    """The text case's corpus: made by a formula, not drawn, so every checkout has it to the byte
    (about 50,000 characters of line-broken words)."""
    vocab = 'the king shall speak of love and night my lord to be or not what is in a name'.split()
    return ''.join(
        vocab[(i * 7 + i // 13) % len(vocab)] + ('.\n' if i % 17 == 16 else ' ')
        for i in range(words)
    )


def case_config(spec: str, overrides: dict, scratch: str):
    path, _, arg = spec.partition(':')
    config = load_config_file(os.path.join(ROOT, path), arg or None)
    values = {
        k: v.format(scratch=scratch) if isinstance(v, str) else v for k, v in overrides.items()
    }
    return with_values(config, values)


def definitions() -> dict:
    """Each case as the record keeps it: its config, every override (COMMON's too), its steps."""
    return {
        name: {'config': s, 'overrides': {**o, **COMMON}, 'steps': STEPS}
        for name, (s, o) in CASES.items()
    }


def read_record(path: str) -> dict:
    """The record at `path`, checked whole before any training (one line naming --record)."""
    try:
        with open(path, encoding='utf-8') as f:
            record = json.load(f)
    except FileNotFoundError:
        raise ValueError(f'--record={path}: no such file (write one with --write)') from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f'--record={path}: cannot be read ({e})') from None
    except json.JSONDecodeError as e:
        raise ValueError(f'--record={path}: not JSON ({e})') from None
    keys = {'toolchain', 'taken', 'cases'}
    if not isinstance(record, dict) or not keys <= set(record):
        raise ValueError(f'--record={path}: expected a JSON object with toolchain, taken and cases')
    cases = record['cases']
    if not isinstance(cases, dict) or not all(isinstance(c, dict) for c in cases.values()):
        raise ValueError(f'--record={path}: cases must map each case name to its run')
    defined = {n: {k: c.get(k) for k in ('config', 'overrides', 'steps')} for n, c in cases.items()}
    if defined != definitions():
        raise ValueError(
            f'--record={path}: its cases differ from scripts/golden_run.py CASES: '
            're-record with --write'
        )
    for name, case in cases.items():
        if not {'loss', 'grad_norm', 'params_sha256', 'eval_loss'} <= set(case):
            raise ValueError(
                f'--record={path}: case {name} lacks loss, grad_norm, params_sha256 or eval_loss'
            )
    return record


def record_text(record: dict) -> str:
    """The record as indented JSON with each step's losses on one line."""
    text = json.dumps(record, indent=1)
    row = re.compile(r'\[\s+("[^"\]]*"(?:,\s+"[^"\]]*")*)\s+\]')
    return row.sub(lambda m: '[' + re.sub(r',\s+', ', ', m.group(1)) + ']', text) + '\n'


def write(path: str, runs: dict) -> None:
    taken = {
        'date': datetime.date.today().isoformat(),
        'commit': source_commit(),
    }
    cases = {n: {**definitions()[n], **r} for n, r in runs.items()}
    with open(path, 'w', encoding='utf-8') as f:
        f.write(record_text({'toolchain': toolchain(), 'taken': taken, 'cases': cases}))
    print(f'wrote {len(cases)} golden runs to {path}')


def chosen_cases() -> list[str]:
    """The cases --cases names (every case by default), checked before any training."""
    if _CASES.value is None:
        return list(CASES)
    if _WRITE.value:
        raise ValueError('--cases: --write records every case; leave --cases out')
    unknown = [n for n in _CASES.value if n not in CASES]
    if unknown or not _CASES.value:
        given = ','.join(_CASES.value)
        raise ValueError(f'--cases={given}: expected names among {", ".join(CASES)}')
    return list(dict.fromkeys(_CASES.value))


def report(record: dict, runs: dict) -> int:
    ours, theirs, taken = toolchain(), record['toolchain'], record['taken']
    exact = ours == theirs
    print(f'record: {taken["commit"] or "no commit"}, {taken["date"]}, {theirs}')
    print(f'this:   {source_commit() or "no commit"}')
    if not exact:
        shown = differences(theirs, ours)
        print(f"another toolchain than the record's ({shown}): compared to {TOOLCHAIN_RTOL:g}")
    results = [compare_golden(n, run, record['cases'][n], exact) for n, run in runs.items()]
    for _, line in results:
        print(line)
    if all(ok for ok, _ in results):
        return 0
    print(
        'training numerics differ from the record: if the change is meant, run '
        "`python scripts/golden_run.py --write` and add a line to docs/train.md's golden-run log"
    )
    return 1


def run() -> int:
    names = chosen_cases()  # before any training
    if _WRITE.value:
        check_output_file(_RECORD.value, '--record', '.json')
    record = None if _WRITE.value else read_record(_RECORD.value)
    with tempfile.TemporaryDirectory() as scratch:
        with open(os.path.join(scratch, 'golden.txt'), 'w', encoding='utf-8') as f:
            f.write(golden_text())
        defined = definitions()
        configs = {
            n: case_config(defined[n]['config'], defined[n]['overrides'], scratch) for n in names
        }
        jax.config.update('jax_platforms', 'cpu')
        set_cpu_devices(configs[names[0]].mesh)  # before JAX starts; every case's is 1
        runs = {n: golden_run(config, STEPS) for n, config in configs.items()}
    if _WRITE.value:
        write(_RECORD.value, runs)
        return 0
    return report(record, runs)


if __name__ == '__main__':
    run_app(run)
