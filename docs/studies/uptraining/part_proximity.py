r"""How near each corpus part lies to the held-out text, under each part layout
(`config.data.split_layout`, lm/data/parts.py), on a play-script text such as Tiny Shakespeare:
per layout and part, the share of held-out speeches whose speaker also speaks in that part, and
the median distance in characters from a held-out character to the nearest character of the
part. Writes one row per layout and part to --out (CSV).

  python docs/studies/uptraining/part_proximity.py --data_path=data/tinyshakespeare.txt \
      --out=docs/studies/uptraining/results/part_proximity.csv
"""

import re

import numpy as np
from absl import flags

from lm.cli import run_app
from lm.config import load_config_file
from lm.data import FOUR, block_parts, cuts, part_shares
from lm.experiments import write_csv

_DATA = flags.DEFINE_string('data_path', 'data/tinyshakespeare.txt', 'A play script (UTF-8).')
_BLOCK = flags.DEFINE_integer('split_block', 1024, 'Interleaved layout: tokens per block.')
_OUT = flags.DEFINE_string('out', 'part_proximity.csv', 'CSV written.')
SPEECH = re.compile(r'(?:^|\n\n)([^\n]+):\n')  # a speech opens with 'NAME:' on its own line


def char_parts(text: str, layout: str, block: int) -> np.ndarray:
    """Each character's part (an index into FOUR), as lm.data.parts cuts a byte-tokenised text
    (each split ends in one end-of-text token)."""
    data = load_config_file('configs/base.py').data
    data.update(split_layout=layout, split_block=block)
    n = len(text)
    cut = int(n * (1 - data.val_fraction))
    token = np.arange(n) + (np.arange(n) >= cut)  # the train split's end-of-text token
    if layout == 'interleaved':
        total = n + 2
        labels = block_parts(-(-total // block), part_shares(data))
        return labels[token // block]
    up, held = cuts(cut + 1, n - cut + 1, data)
    val = token - (cut + 1)
    return np.where(token < up, 0, np.where(token <= cut, 1, np.where(val < held, 2, 3)))


def proximity(text: str, parts: np.ndarray) -> list[dict]:
    """Per training part: held-out speeches whose speaker speaks there, median gap in chars."""
    speeches = [(m.start(1), m.group(1)) for m in SPEECH.finditer(text)]
    held = np.flatnonzero(parts == 3)
    held_speakers = [name for start, name in speeches if parts[start] == 3]
    rows = []
    for i, name in enumerate(FOUR[:3]):
        speakers = {s for start, s in speeches if parts[start] == i}
        where = np.flatnonzero(parts == i)
        k = np.clip(np.searchsorted(where, held), 1, len(where) - 1)
        gap = np.minimum(np.abs(where[k] - held), np.abs(where[k - 1] - held))
        rows.append(
            {
                'part': name,
                'share_of_text': round(len(where) / len(text), 4),
                'heldout_speeches_by_its_speakers': round(
                    np.mean([s in speakers for s in held_speakers]), 4
                ),
                'median_chars_to_heldout': int(np.median(gap)),
            }
        )
    return rows


def run() -> int:
    with open(_DATA.value, encoding='utf-8') as f:
        text = f.read()
    rows = []
    for layout in ('contiguous', 'interleaved'):
        for row in proximity(text, char_parts(text, layout, _BLOCK.value)):
            rows.append({'layout': layout, **row})
            print(rows[-1])
    write_csv(_OUT.value, rows)
    return 0


if __name__ == '__main__':
    run_app(run)
