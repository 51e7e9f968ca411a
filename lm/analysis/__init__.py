"""The analysis wing: what each attention head does (scores from attention weights), per-run
reports, heatmaps and TensorBoard entries.
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'report': (
            'RunHeads',
            'SCORES',
            'analyse_run',
            'check_runs',
            'file_label',
            'parse_run',
            'summary_markdown',
            'write_csv',
            'write_kv_csv',
        ),
        'plots': (
            'attention_figure',
            'kv_figure',
            'log_run',
            'loss_figure',
            'save',
            'score_figure',
        ),
    },
)
