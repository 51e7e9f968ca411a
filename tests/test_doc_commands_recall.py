"""docs/studies/recall/README.md's commands, scaled down (tests/doc_plan.py): its own chain of runs, a test file
of its own so that the suite's workers run it beside the main chain."""

import pytest
from conftest import ROOT
from doc_plan import run_chain


@pytest.mark.slow
def test_recall_doc_chain_runs_scaled_down(tmp_path):
    run_chain('recall', tmp_path)
    for path in ('docs/studies/recall/results/mqar_calibration.csv', 'docs/studies/recall/results/mqar_calibration_p4.csv'):
        assert (tmp_path / path).exists(), path
    recall = (tmp_path / 'docs' / 'recall.md').read_text()
    assert recall != (ROOT / 'docs' / 'recall.md').read_text(), 'make_tables.py left the table'
