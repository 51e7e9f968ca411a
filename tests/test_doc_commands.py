"""Every shell command of README.md and the reference pages of docs/ runs, scaled down by the
`ci:` comment beside it (tests/doc_commands.py); the studies' commands are flag-checked in
tests/test_doc_flags.py."""

import json
import re
import sys

import numpy as np
import pytest
from conftest import ROOT
from doc_commands import REFERENCE, STUDIES, bash, doc_commands, run_chain, scaled, scratch, walk


def test_every_ci_comment_applies_to_its_command():
    """A `ci:` substitution that matches nothing, or a `{NAME}` with no scaling, fails here (in
    the fast tier) instead of deep in the chain."""
    for doc in REFERENCE + STUDIES:
        for command, action in doc_commands((ROOT / doc).read_text()):
            scaled(command, action)


def test_the_chains_python_is_the_tests_own(tmp_path):
    """`python` in the chains is this interpreter with its packages, also in a virtualenv (a
    link to a venv's python starts the base interpreter, without the venv's packages)."""
    out = bash('python -c "import sys, absl; print(sys.prefix)"', tmp_path, scratch(tmp_path))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == sys.prefix


@pytest.mark.slow
def test_reference_commands_run_scaled_down(tmp_path):
    run_chain(tmp_path)
    for path in (
        'runs/quickstart/checkpoints',
        'runs/heads_analysis/heads.csv',
        'out/llama2_gqa8/config.json',
        'runs/heads/summary.md',
        'runs/kinds/summary.md',
        'runs/sampling/summary.md',
        'kinds_other.csv',
        'kinds_cache.csv',
        'runs/mla64/checkpoints',
        'runs/mqa_cla2/checkpoints',
        'runs/cla2/checkpoints',
        'runs/mqar_mha/checkpoints',
        'runs/passkey_mqa/checkpoints',
    ):
        assert (tmp_path / path).exists(), path
    check_the_hf_round_trip(tmp_path / 'runs' / 'llama2_gqa8', tmp_path / 'out' / 'llama2_gqa8')


def check_the_hf_round_trip(run, out) -> None:
    """docs/convert.md's chain (import the MHA fixture -> eval -> generate -> uptrain to GQA ->
    train -> export): the export is a Llama of 2 KV heads with its tokenizer, reads back bitwise,
    and (with transformers) loads there with lm's logits."""
    from test_hf import (
        FIXTURES,
        HAVE_TORCH,
        assert_bitwise_equal,
        assert_close_logits,
        base_config,
        flat_params,
        model_of,
        transformers_logits,
    )

    from lm.convert.hf_io import import_hf

    exported = json.loads((out / 'config.json').read_text())
    assert exported['num_key_value_heads'] == 2 and exported['model_type'] == 'llama'
    assert (out / 'tokenizer.json').is_file() and (out / 'tokenizer_config.json').is_file()
    import_hf(str(out), str(out.parent / 'back'), base_config())
    assert_bitwise_equal(flat_params(run), flat_params(out.parent / 'back'))
    if HAVE_TORCH:
        tokens = np.load(FIXTURES / 'llama_mha' / 'tokens.npy')
        model, _ = model_of(run)
        assert_close_logits(model(tokens), transformers_logits(out, tokens))


def test_studies_are_not_run():
    """Only reference pages chain; a study's commands are never in it."""
    assert not [d for d in REFERENCE if d.startswith('docs/studies/')]
    assert STUDIES and all(d.startswith('docs/studies/') for d in STUDIES)
    assert not [c for _, c, a, _ in walk(STUDIES, study=True) if a.kind != 'flags']


def test_readme_names_sweep_runs_and_hparams_as_the_code_does():
    """The README's sweep run names are run_name's for the points they name; its HParams columns
    are hparam_values' keys in order and its metrics METRICS; the sweep's HParams tab opens on
    METRICS[0], and the columns the README says differ between the named runs do."""
    from conftest import tiny_config

    from lm.experiments.sweep_points import point_config, run_name
    from lm.model.accounting import param_counts
    from lm.model.transformer import model_config
    from lm.train.hparams import METRICS, hparam_values

    readme = ' '.join((ROOT / 'README.md').read_text().split())
    names = re.search(r'named by attention kind and heads: ((?:`\w+`, )+)then any other', readme)
    assert names, 'README: the sweep run-name sentence moved'
    values = {}
    for name in re.findall(r'`(\w+)`', names.group(1)):
        parsed = re.fullmatch(r'([a-z]+)_h(\d+)(?:_kv(\d+))?', name)
        assert parsed, f'README: run name {name!r} is not <kind>_h<heads>[_kv<kv heads>]'
        kind, heads, kv = parsed.groups()
        point = {'model.attention': kind, 'model.num_heads': int(heads)}
        if kv:
            point['model.num_kv_heads'] = int(kv)
        config = point_config(tiny_config(), point)
        assert run_name(point, config) == name, point
        cfg = model_config(config.model)
        values[name] = hparam_values(config, cfg, param_counts(cfg)['total'])
    assert {'gqa', 'mha'} <= {name.split('_')[0] for name in values}, values

    found = re.search(r'comparison columns under HParams \(([^;]*); metrics ([^)]*)\)', readme)
    assert found, 'README: the HParams column sentence moved'
    columns, metrics = found.groups()
    gqa = next(v for name, v in values.items() if name.startswith('gqa'))
    assert re.findall(r'`([\w.]+)`', columns.split("MLA's")[0]) == list(gqa)
    gqa_config = point_config(tiny_config(), {'model.attention': 'gqa', 'model.num_kv_heads': 2})
    gqa_config.uptrain.method = 'mean'
    cfg = model_config(gqa_config.model)
    uptrained = hparam_values(gqa_config, cfg, param_counts(cfg)['total'])
    said = re.findall(r'`([\w.]+)`', columns.split("an uptrained run's")[1])
    assert said == [k for k in uptrained if k not in gqa], 'README: the uptrained columns'
    assert re.findall(r'`([\w/]+)`', metrics) == list(METRICS)

    found = re.search(
        r'HParams tab opens on eval perplexity and the columns that differ between the runs '
        r'\(((?:`[\w.]+`, )+)\.\.\.\)',
        readme,
    )
    assert found, 'README: the sweep HParams sentence moved'
    assert METRICS[0] == 'eval/perplexity'
    for column in re.findall(r'`([\w.]+)`', found.group(1)):
        assert len({repr(v.get(column)) for v in values.values()}) > 1, column
