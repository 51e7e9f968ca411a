"""The experiments wing: sweeps and uptraining ablations, equal-budget comparisons, statistics over
seeds, summaries, pre-registered trends and the tables the studies' reports are generated from.
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'runner': (
            'STARTED',
            'RunStopped',
            'StopRuns',
            'check as check_specs',
            'read_result',
            'run as run_specs',
        ),
        'sweep': (
            'check_overrides as check_sweep_overrides',
            'check_same_fairness',
            'combine',
            'fairness as sweep_match',
            'file_points',
            'load_sweep_file',
            'plan as plan_sweep',
        ),
        'sweep_points': ('parse_grid',),
        'sweep_status': ('progress',),
        'sweep_ensemble': ('check_ensembles_divide', 'one_seed_runs_left', 'seed_runs'),
        'fairness': ('MATCHES',),
        'sweep_summary': ('summarise as summarise_sweep',),
        'outputs': (
            'check_not_record_file',
            'check_output_path',
            'check_output_file',
            'mark_ablation',
        ),
        'ablation_arms': ('Ablation', 'base_config'),
        'ablation': (
            'check_configs as check_ablation',
            'plan as plan_ablation',
        ),
        'ablation_tables': (
            'PLOTTED',
            'check_comparable',
            'chosen_runs',
            'compare_table',
            'lr_grid_rows',
            'report as ablation_report',
            'tables as ablation_markdown',
        ),
        'summary': ('seed_rows', 'write_csv'),
        'stats': ('estimate',),
        'trend': (
            'contrasts as trend_contrasts',
            'gap_change',
            'per_seed_contrasts',
            'sd_upper_bound',
            'seeds_needed',
            't_test_power',
        ),
        'pareto': (
            'METRICS',
            'Point',
            'front',
            'higher_is_better',
            'points as pareto_points',
            'read_table',
            'runs_in',
            'runs_of',
        ),
        'pareto_plot': ('figure as pareto_figure', 'log_images', 'summarise as summarise_pareto'),
        'lr_grid': ('at_chosen_rates', 'check_seeds', 'screen_choices', 'stack'),
        'cache_quality': (
            'evaluate_run',
            'finished_runs',
            'check_one_task',
            'heldout_rows',
            'pareto_rows',
            'quantized_rows',
        ),
        'tables': ('rendered_docs', 'update_docs', 'write_docs'),
    },
)
