"""The convert wing: Hugging Face checkpoints in and out, and checkpoint conversions between
attention variants (MHA -> GQA/MQA by pooling or merging KV heads, MHA -> MLA).
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'hf_io': ('export_hf', 'import_hf'),
        'hf_files': ('max_position',),
        'staging': ('check_export_dir', 'check_import_dir'),
        'options': (
            'KEYS',
            'SCHEDULES',
            'ConversionOptions',
            'check_conversion',
            'check_uptrain_config',
        ),
        'methods': ('calibration_inputs',),
        'uptrain': (
            'METHODS',
            'SOURCE',
            'WORKDIR',
            'cache_summary',
            'convert_checkpoint',
            'optimizer_state_summary',
        ),
        'uptrain_ensemble': ('convert_ensemble', 'member_workdirs'),
        'mla': ('choose_stride', 'pair_contribution'),
        'rope_selection': ('selections',),
    },
)
