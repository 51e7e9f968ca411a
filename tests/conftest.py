"""Shared fixtures: tiny configs built from configs/base.py."""

import os
import pathlib

import pytest

from lm.config import load_config_file

ROOT = pathlib.Path(__file__).resolve().parents[1]
SHAKESPEARE = ROOT.parent / 'shared' / 'data' / 'tinyshakespeare.txt'


def tiny_config(**model_overrides):
    """configs/base.py with a tiny model (vocab 61, d_model 32, 2 layers, 4 heads)."""
    config = load_config_file(os.fspath(ROOT / 'configs' / 'base.py'))
    config.model.update(
        vocab_size=61,
        d_model=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=0,
        mlp_dim=64,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=4,
        v_head_dim=6,
    )
    config.model.update(model_overrides)
    return config


@pytest.fixture
def shakespeare_path():
    if not SHAKESPEARE.exists():
        pytest.skip(f'{SHAKESPEARE} not found')
    return SHAKESPEARE
