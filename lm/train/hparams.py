"""TensorBoard's HParams tab: a run's comparison columns (`hparam_values`) and the experiment
summary of a TensorBoard directory (`register`).

The HParams dashboard shows hparams that differ between runs first (then by name) and ticks the
first five; it shows the first five metrics of the experiment summary. TensorBoard reads
`differs` from the experiment summary when one exists, and needs one to limit the metrics to
those below, so every run of a TensorBoard directory carries the same summary, made from the
hparams of all its runs (`<logdir>/hparams.json`) with `differs` computed over them, rewritten
whenever a run registers. A TensorBoard started earlier keeps the summary it first read:
restart it to see runs registered since.
"""

from __future__ import annotations

import dataclasses
import fcntl
import glob
import json
import os
import sys
import time

import ml_collections

from lm.model import accounting, attention
from lm.model.config import ModelConfig
from lm.train.workdir import read_json_object


def import_tensorboardx() -> None:
    """Imports tensorboardX without PyTorch: its writer module imports torch where installed
    (2-4 s of start-up) only to accept torch tensors, which lm never logs. A process that has
    imported torch already keeps it."""
    if 'tensorboardX' in sys.modules:
        return
    absent = 'torch' not in sys.modules
    if absent:
        sys.modules['torch'] = None  # `import torch` raises ImportError while this is set
    try:
        import tensorboardX  # noqa: F401
    finally:
        if absent:
            del sys.modules['torch']


# The metric columns, in the order the dashboard shows them.
METRICS = ('eval/perplexity', 'eval/loss', 'eval/bits_per_byte', 'train/loss')
VALUES_FILE = 'hparams.json'  # a run's hparams, next to its event files
EVENT_FILE = 'events.out.tfevents.0.hparams'  # the experiment summary and the run's hparams
_DIFFERS = bytes([7 << 3, 1])  # HParamInfo.differs = true (field 7), absent from tensorboardX


def hparam_values(c: ml_collections.ConfigDict, cfg: ModelConfig, num_params: int) -> dict:
    """The columns runs are compared by: attention, query and KV heads (MLA: its section's
    dims instead of KV heads), KV-cache bytes per token (bfloat16, all layers), parameters,
    seed, peak lr, steps and, for an uptrained run, its conversion."""
    values: dict = {'attention': cfg.attention, 'num_heads': int(cfg.num_heads)}
    kv = attention.variant(cfg).kv_heads(cfg)
    if kv.isdigit():
        values['num_kv_heads'] = int(kv)
    values['kv_cache_bytes_per_token'] = int(accounting.kv_cache_bytes_per_token(cfg, 'bfloat16'))
    values.update(params=int(num_params), seed=int(c.seed), lr=float(c.train.lr))
    values['steps'] = int(c.train.steps)
    if cfg.section is not None:
        name = attention.variant(cfg).config_section
        dims = dataclasses.asdict(cfg.section).items()  # its widths and ranks, not its epsilons
        values.update({f'{name}.{k}': v for k, v in dims if isinstance(v, int)})
    if c.uptrain.method:
        values.update({'uptrain.method': c.uptrain.method, 'uptrain.grouping': c.uptrain.grouping})
    return values


def register(logdir: str, root: str, values: dict) -> None:
    """Records `values` as the hparams of the run in `logdir` (a directory in or equal to the
    TensorBoard directory `root`) and rewrites the experiment summary of every run in `root`."""
    os.makedirs(logdir, exist_ok=True)
    _write_json(os.path.join(logdir, VALUES_FILE), values)
    with open(os.path.join(root, '.hparams.lock'), 'w') as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # runs of a parallel sweep register at once
        runs = {}
        # runs in root, or one level deeper (an ensemble's members: <run>/seed_<s>)
        paths = [os.path.join(glob.escape(root), *s, VALUES_FILE) for s in (['*'], ['*', '*'])]
        for path in sorted({p for pattern in paths for p in glob.glob(pattern)}) + [
            os.path.join(root, VALUES_FILE)
        ]:
            if os.path.exists(path):
                runs[os.path.dirname(path)] = read_json_object(path)
        summary = experiment(list(runs.values()))
        for run_dir, run_values in runs.items():
            _write_events(os.path.join(run_dir, EVENT_FILE), summary, run_values)


def experiment(runs: list[dict]):
    """The experiment summary of `runs` (each a `hparam_values` dict): every hparam with its
    type, domain and whether it differs between runs, and the metrics of METRICS."""
    import_tensorboardx()
    from tensorboardX.proto.api_pb2 import DataType, Experiment, HParamInfo, MetricInfo, MetricName

    names = list(dict.fromkeys(k for r in runs for k in r))
    infos = []
    for name in names:
        values = [r[name] for r in runs if name in r]
        info = HParamInfo(name=name, type=DataType.Value(f'DATA_TYPE_{_type(values)}'))
        if _type(values) == 'FLOAT64':
            info.domain_interval.min_value = min(values)
            info.domain_interval.max_value = max(values)
        else:
            for v in sorted(set(values), key=str):
                if _type(values) == 'BOOL':
                    info.domain_discrete.values.add().bool_value = v
                else:
                    info.domain_discrete.values.add().string_value = str(v)
        if len(set(map(repr, values))) > 1:
            info = HParamInfo.FromString(info.SerializeToString() + _DIFFERS)
        infos.append(info)
    metrics = [MetricInfo(name=MetricName(tag=tag)) for tag in METRICS]
    return Experiment(hparam_infos=infos, metric_infos=metrics)


def _type(values: list) -> str:
    if all(isinstance(v, bool) for v in values):
        return 'BOOL'
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return 'FLOAT64'
    return 'STRING'


def _write_json(path: str, data: dict) -> None:
    with open(path + '.tmp', 'w') as f:
        json.dump(data, f, indent=1)
    os.replace(path + '.tmp', path)


def _write_events(path: str, summary, values: dict) -> None:
    """One event file holding the experiment summary and the run's session-start info (its
    hparams), replaced atomically."""
    import_tensorboardx()
    from tensorboardX.proto.event_pb2 import Event
    from tensorboardX.proto.plugin_hparams_pb2 import HParamsPluginData, SessionStartInfo
    from tensorboardX.proto.summary_pb2 import Summary, SummaryMetadata
    from tensorboardX.record_writer import RecordWriter

    start = SessionStartInfo()
    for k, v in values.items():
        if isinstance(v, bool):
            start.hparams[k].bool_value = v
        elif isinstance(v, int | float):
            start.hparams[k].number_value = float(v)
        else:
            start.hparams[k].string_value = str(v)
    tmp = os.path.join(os.path.dirname(path), '.hparams_events.tmp')  # no 'tfevents': unread
    writer = RecordWriter(tmp)
    for tag, data in (
        ('_hparams_/experiment', HParamsPluginData(experiment=summary, version=0)),
        ('_hparams_/session_start_info', HParamsPluginData(session_start_info=start, version=0)),
    ):
        plugin = SummaryMetadata.PluginData(plugin_name='hparams', content=data.SerializeToString())
        value = Summary.Value(tag=tag, metadata=SummaryMetadata(plugin_data=plugin))
        event = Event(wall_time=time.time(), summary=Summary(value=[value]))
        writer.write(event.SerializeToString())
    writer.close()
    os.replace(tmp, path)
