"""The train wing: run assembly (`run`), the jitted train/eval steps, the loop, optimizer,
checkpoints, the run directory, evaluation, TensorBoard and the run log; performance accounting
(`perf`: MFU and the decode roofline) and profiler traces (`profile`). Imports neither `convert`
nor `analysis`.
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'run': (
            'Run',
            'assemble',
            'check_config',
            'check_devices',
            'check_loop_config',
            'check_not_past',
            'check_seed',
        ),
        'stored': ('finished_step', 'inherited_data', 'stored_config'),
        'loop': ('train',),
        'ensemble': (
            'check_scores_fit',
            'device_memory',
            'ensemble_loop_default',
            'member_config',
            'member_seeds',
            'state_bytes',
        ),
        'ensemble_run': (
            'member_logdir',
            'split_member',
            'split_members',
            'split_request',
        ),
        'step': (
            'call_sharding',
            'device_call_batch',
            'make_eval_step',
            'make_train_step',
            'parse_xla_options',
        ),
        'evaluation': ('eval_batch_size', 'evaluate_recall'),
        'summary': (
            'Summary',
            'check_logdir_owner',
            'check_tb_dir_kept',
            'claim_logdir',
            'run_logdir',
        ),
        'interrupt': ('EntryPointStop', 'Interrupted', 'StopRequest'),
        'workdir': (
            'A_RUN',
            'A_SWEEP',
            'AN_ABLATION',
            'RunError',
            'WorkdirLock',
            'check_new_run_dir',
            'check_run_dir',
            'check_replaceable',
            'check_not_in_checkpoints',
            'check_not_inside_a_run',
            'check_train_workdir',
            'directory_kind',
            'remember_tb_dir',
            'remembered_tb_dir',
            'safe_name',
        ),
        'checkpoint': ('check_finite', 'latest_sound_step', 'read_latest_meta'),
        'golden': (
            'TOOLCHAIN_RTOL',
            'compare as compare_golden',
            'first_difference',
            'golden_run',
            'relative_difference',
        ),
        'provenance': (
            'SESSIONS',
            'differences',
            'source_code',
            'source_commit',
            'toolchain',
            'trained_by',
            'version',
        ),
        'perf': (
            'PEAK_FLOPS',
            'add_roofline',
            'cpu_model',
            'device_description',
            'memory_reference',
            'mfu',
            'peak_flops',
            'reference_text',
            'spec_bandwidth',
        ),
        'profile': ('Profile', 'load_profile', 'print_profile'),
    },
)
