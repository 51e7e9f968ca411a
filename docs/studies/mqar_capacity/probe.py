r"""The exploratory MQAR probes of the second round's statement (README.md): lm's model in a plain
optax loop (not the trainer), one seed, the recipe's optimizer (AdamW, linear warmup then a
constant rate, beta2 0.99, weight decay 0, tied embeddings, batch 64), `mqar_zoology` rows; it
prints accuracy on the answers of 1,000 rows of another seed every 1000 steps. The probe table
and its erratum (MQA at 256 symbols; GQA-2 and MQA to 10,000 steps):

  for spec in "--kv_heads=1 --vocab=128" "--kv_heads=1 --vocab=256" "--kv_heads=2" \
      "--heads=1 --kv_heads=1" "--heads=2 --kv_heads=1" "--heads=2 --kv_heads=2" \
      "--kv_heads=2 --steps=10000" "--kv_heads=1 --steps=10000"; do
    python docs/studies/mqar_capacity/probe.py $spec
  done

Its numbers are descriptions of single runs, not results: the study's cells train with
train.py's loop, several seeds, and score a second held-out set.
"""

import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import flags
from flax import nnx

from lm.cli import run_app
from lm.config import load_config_file
from lm.data.recall import pack, unpack, zoology_rows
from lm.model import build_model, model_config

_LR = flags.DEFINE_float('lr', 3e-3, 'Peak (and constant) learning rate.')
_STEPS = flags.DEFINE_integer('steps', 3000, 'Training steps.')
_PAIRS = flags.DEFINE_integer('pairs', 4, 'Key-value pairs per row (rows of 4 x pairs tokens).')
_VOCAB = flags.DEFINE_integer('vocab', 1024, 'Symbols (keys and values from disjoint halves).')
_HEADS = flags.DEFINE_integer('heads', 4, 'Query heads.')
_KV_HEADS = flags.DEFINE_integer('kv_heads', 4, 'KV heads.')
_HEAD_DIM = flags.DEFINE_integer('head_dim', 0, 'Head width; 0 = 64 / heads.')
_SEED = flags.DEFINE_integer('seed', 0, 'Initialisation and training-row seed.')
D_MODEL, LAYERS, BATCH, WARMUP = 64, 2, 64, 100


def rows(rng: np.random.Generator, n: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """n rows as (inputs [n, T], targets [n, T], answer weights [n, T])."""
    tokens, scored = zoology_rows(rng, n, 4 * _PAIRS.value, _PAIRS.value, _VOCAB.value)
    x, y = unpack(pack(tokens, scored, label_only=True))
    return jnp.asarray(x), jnp.asarray(y), jnp.asarray(scored[:, 1:].astype(np.float32))


def loss_and_accuracy(model: nnx.Module, x, y, w) -> tuple[jax.Array, jax.Array]:
    logits = model(x).astype(jnp.float32)
    nll = -jnp.take_along_axis(jax.nn.log_softmax(logits), y[..., None], -1)[..., 0]
    right = logits.argmax(-1) == y
    return (nll * w).sum() / w.sum(), (right * w).sum() / w.sum()


def run() -> int:
    config = load_config_file('configs/base.py')
    config.model.update(
        d_model=D_MODEL,
        num_layers=LAYERS,
        num_heads=_HEADS.value,
        num_kv_heads=_KV_HEADS.value,
        head_dim=_HEAD_DIM.value or D_MODEL // _HEADS.value,
        vocab_size=_VOCAB.value,
        tie_embeddings=True,
    )
    model = build_model(model_config(config.model), _SEED.value)
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, _LR.value, WARMUP), optax.constant_schedule(_LR.value)],
        [WARMUP],
    )
    optimizer = nnx.Optimizer(
        model, optax.adamw(schedule, b2=0.99, weight_decay=0.0), wrt=nnx.Param
    )

    @nnx.jit
    def step(model, optimizer, x, y, w):
        grad_fn = nnx.value_and_grad(loss_and_accuracy, has_aux=True)
        (loss, _), grads = grad_fn(model, x, y, w)
        optimizer.update(model, grads)
        return loss

    evaluate = nnx.jit(loss_and_accuracy)
    train_rng, heldout = (
        np.random.default_rng(1000 + _SEED.value),
        rows(np.random.default_rng(7), 1000),
    )
    start = time.time()
    for i in range(1, _STEPS.value + 1):
        step(model, optimizer, *rows(train_rng, BATCH))
        if i % 1000 == 0 or i == _STEPS.value:
            loss, accuracy = evaluate(model, *heldout)
            print(
                f'step {i}: answer loss {float(loss):.3f}, accuracy {float(accuracy):.3f} '
                f'({time.time() - start:.0f} s)',
                flush=True,
            )
    return 0


if __name__ == '__main__':
    run_app(run)
