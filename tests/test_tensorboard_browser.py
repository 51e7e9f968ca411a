"""The HParams dashboard of a sweep, opened in a real (headless) browser: the columns that say
which KV-head count wins are there without a click."""

import os
import socket
import subprocess
import sys
import time

import pytest
from conftest import ENV, run_entry, sweep_file, tiny_train_config

CHROMIUM, CHROMEDRIVER = '/usr/bin/chromium', '/usr/bin/chromedriver'

# The text of every rendered cell of the HParams table (header first), read through the
# dashboard's shadow roots; hidden columns are not rendered.
CELLS = """
const out = [];
function walk(node) {
  if (node.shadowRoot) walk(node.shadowRoot);
  for (const child of node.children || []) walk(child);
  if (node.tagName === 'VAADIN-GRID-CELL-CONTENT') out.push(node.textContent.trim());
}
walk(document.body);
return out;
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def wait_for_port(port: int, process: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        assert process.poll() is None, 'tensorboard exited'
        with socket.socket() as s:
            if s.connect_ex(('127.0.0.1', port)) == 0:
                return
        time.sleep(0.5)
    raise AssertionError(f'tensorboard did not listen on port {port} within {timeout} s')


def browser():
    webdriver = pytest.importorskip('selenium.webdriver')
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ('--headless=new', '--no-sandbox', '--disable-dev-shm-usage'):
        options.add_argument(arg)
    options.add_argument('--window-size=1600,1000')
    return webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)


def table_cells(driver, url: str, first_trial: str, timeout: float = 90) -> list[str]:
    """The HParams table's cells once its rows are there (TensorBoard loads runs lazily)."""
    deadline = time.time() + timeout
    driver.get(url)
    while time.time() < deadline:
        cells = driver.execute_script(CELLS)
        if first_trial in cells:
            return cells
        time.sleep(1)
        if not cells:
            driver.refresh()
    raise AssertionError(f'no HParams table with {first_trial} after {timeout} s: {cells}')


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.path.exists(CHROMIUM) and os.path.exists(CHROMEDRIVER)),
    reason='needs Debian chromium and chromium-driver',
)
def test_hparams_dashboard_shows_what_kv_heads_cost_and_win(tmp_path, small_text):
    pytest.importorskip('selenium')
    pytest.importorskip('tensorboard')
    config = tiny_train_config(
        tmp_path, small_text, **{'train.steps': 4, 'eval_every': 4, 'checkpoint_every': 4}
    )
    cfg = sweep_file(tmp_path, config, [{}])
    out = run_entry(
        'scripts/sweep.py',
        f'--config={cfg}',
        f'--sweep_dir={tmp_path / "sw"}',
        '--grid=model.num_kv_heads=1,2,4',
        '--parallel=2',
        timeout=900,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    names = ['gqa_h4_kv1', 'gqa_h4_kv2', 'gqa_h4_kv4']  # and 'pareto': the sweep's figure
    logged = sorted(n for n in os.listdir(tmp_path / 'sw' / 'tb') if not n.startswith('.'))
    assert logged == [*names, 'pareto']

    port = free_port()
    board = subprocess.Popen(
        [sys.executable, '-m', 'tensorboard.main', f'--logdir={tmp_path / "sw" / "tb"}']
        + ['--host=127.0.0.1', f'--port={port}'],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    driver = None
    try:
        wait_for_port(port, board)
        driver = browser()
        cells = table_cells(driver, f'http://127.0.0.1:{port}/#hparams', names[0])
    finally:
        if driver is not None:
            driver.quit()
        board.terminate()
        board.wait(30)
    header = cells[: cells.index(names[0])]
    for column in ('num_kv_heads', 'kv_cache_bytes_per_token', 'eval/perplexity'):
        assert column in header, header
    # what differs between the runs comes first, and trial names are shown whole
    assert set(header[2:5]) == {'num_kv_heads', 'kv_cache_bytes_per_token', 'params'}, header
    assert {n for n in names if n in cells} == set(names)
