"""'epochs' sampling: a seeded permutation of non-overlapping windows, every window once per
epoch, batches a pure function of (seed, step) across epoch boundaries and hosts."""

import os
import shutil

import numpy as np
import pytest
from conftest import read_scalars, stdlib_text, tiny_train_config

from lm.data.windows import call_batch, num_windows, permute, train_batch
from lm.train.loop import train
from lm.train.run import assemble


@pytest.mark.parametrize('n', [1, 2, 3, 17, 1000, 4099])
def test_permute_is_a_seeded_permutation(n):
    images = permute(np.arange(n), n, (0, 1))
    np.testing.assert_array_equal(np.sort(images), np.arange(n))
    np.testing.assert_array_equal(permute(np.arange(n), n, (0, 1)), images)  # deterministic
    if n >= 17:
        assert not np.array_equal(images, np.arange(n))
        assert not np.array_equal(permute(np.arange(n), n, (0, 2)), images)


def test_epochs_read_every_window_once_per_epoch():
    tokens = np.arange(1005, dtype=np.uint16)  # token i at position i
    kw = dict(seed=3, batch_size=8, seq_len=10, sampling='epochs')
    windows = num_windows(len(tokens), 10)
    assert windows == 100  # 1004 targets: the last 4 are never a window's
    batches = [train_batch(tokens, step=s, **kw) for s in range(25)]  # 200 rows: two epochs
    rows = np.concatenate(batches)
    assert rows.shape == (200, 11) and rows.dtype == np.int32
    np.testing.assert_array_equal(rows[:, 1:], rows[:, :-1] + 1)  # whole windows
    starts = rows[:, 0]
    for epoch in (starts[:100], starts[100:]):
        np.testing.assert_array_equal(np.sort(epoch), np.arange(100) * 10)  # each once
    assert not np.array_equal(starts[:100], starts[100:])  # a new order every epoch
    # Step 12 (rows 96..103) straddles the two epochs. A resumed run asks for steps from
    # anywhere: the same rows; hosts take disjoint halves of each step.
    resumed = call_batch(tokens, step=11, steps=3, **kw)
    np.testing.assert_array_equal(resumed, np.stack(batches[11:14]))
    halves = [train_batch(tokens, step=12, process_index=p, process_count=2, **kw) for p in (0, 1)]
    np.testing.assert_array_equal(np.concatenate(halves), batches[12])
    other = np.concatenate([train_batch(tokens, step=s, **{**kw, 'seed': 4}) for s in range(13)])
    assert not np.array_equal(other[:100, 0], starts[:100])  # the seed decides the order


def test_random_sampling_is_unchanged():
    """'random' (the default) draws the same windows as before 'epochs' existed."""
    tokens = np.arange(10_000, dtype=np.uint16)
    batch = train_batch(tokens, seed=3, step=5, batch_size=8, seq_len=16)
    starts = np.random.default_rng([3, 5]).integers(0, 10_000 - 16, 8)
    np.testing.assert_array_equal(batch[:, 0], starts)
    np.testing.assert_array_equal(
        batch, train_batch(tokens, seed=3, step=5, batch_size=8, seq_len=16, sampling='random')
    )


@pytest.mark.slow
def test_a_run_with_epochs_and_document_masks_resumes_exactly_mid_epoch(tmp_path):
    path = tmp_path / 'short.txt'
    path.write_text(stdlib_text(1_200), encoding='utf-8')  # 1 081 train tokens: 67 windows
    overrides = {'data.sampling': 'epochs', 'data.document_mask': True, 'train.steps': 24}
    overrides.update(checkpoint_every=8, eval_every=24, log_every=4)
    config = tiny_train_config(tmp_path, path, **overrides)
    assert assemble(config, data=True).ctx.document_eos == 256  # the byte tokenizer's EOS
    train(config, str(tmp_path / 'a'))
    epochs = read_scalars(tmp_path / 'a' / 'tb', 'data/epochs')
    assert sorted(epochs) == [4, 8, 12, 16, 20, 24]
    np.testing.assert_allclose(epochs[24], 24 * 4 / 67, rtol=1e-6)  # past one epoch at 16.75
    assert read_scalars(tmp_path / 'a' / 'tb', 'data/tokens_seen')[24] == 24 * 4 * 16
    # Resume from step 8 (mid-epoch) through the epoch boundary: the same batches, bitwise.
    shutil.copytree(tmp_path / 'a', tmp_path / 'b')
    for name in ('checkpoints/16', 'checkpoints/24', 'tb'):
        shutil.rmtree(tmp_path / 'b' / name)
    os.remove(tmp_path / 'b' / 'results.json')
    assert train(config, str(tmp_path / 'b'))['step'] == 24
    want = read_scalars(tmp_path / 'a' / 'tb', 'train/loss')
    got = read_scalars(tmp_path / 'b' / 'tb', 'train/loss')
    assert sorted(got) == list(range(9, 25))
    assert [got[s] for s in range(9, 25)] == [want[s] for s in range(9, 25)]
