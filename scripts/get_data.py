"""Fetch a public data set into data/ (git-ignored), checked against its SHA-256.

  python scripts/get_data.py tinyshakespeare                  # downloads data/tinyshakespeare.txt
  python scripts/get_data.py tinyshakespeare --from=input.txt # no network: copy a local file

A file already in place with the right checksum is kept; a wrong one is replaced.
"""

import hashlib
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request

from absl import app, flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name -> (URL, SHA-256 of the file, file name under data/)
DATASETS = {
    'tinyshakespeare': (
        'https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt',
        '86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed',
        'tinyshakespeare.txt',
    ),
}

_FROM = flags.DEFINE_string(
    'from', '', 'Copy this local file instead of downloading (its checksum is checked too).'
)
_OUT = flags.DEFINE_string('out_dir', os.path.join(REPO_ROOT, 'data'), 'Where the file goes.')
_TIMEOUT = flags.DEFINE_float('timeout', 30.0, 'Seconds to wait for the server.')


def sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, 'rb') as f:
        for block in iter(lambda: f.read(1 << 20), b''):
            digest.update(block)
    return digest.hexdigest()


def fetch(name: str, source: str, out_dir: str, timeout: float) -> str:
    """Puts data set `name` into `out_dir` (from `source`, a local file, or its URL) and
    returns its path; raises ValueError in one line when it cannot."""
    if name not in DATASETS:
        raise ValueError(f'unknown data set {name!r}; known: {", ".join(sorted(DATASETS))}')
    url, want, filename = DATASETS[name]
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise ValueError(f'--out_dir={out_dir!r} is a file, not a directory')
    if source and not os.path.isfile(source):
        raise ValueError(f'--from={source!r} is not a file')
    if source and (got := sha256(source)) != want:  # checked even when the file is there
        raise ValueError(
            f'--from={source!r} has SHA-256 {got}, not the expected {want}: not the {name} file'
        )
    target = os.path.join(out_dir, filename)
    if os.path.isfile(target) and sha256(target) == want:
        return target
    try:
        os.makedirs(out_dir, exist_ok=True)
        tmp = tempfile.NamedTemporaryFile(dir=out_dir, prefix=f'.{filename}.', delete=False).name
    except OSError as e:
        raise ValueError(f'--out_dir={out_dir!r} is not writable ({e.strerror})') from None
    try:
        if source:
            shutil.copyfile(source, tmp)
            origin = f'--from={source!r}'
        else:
            try:
                with urllib.request.urlopen(url, timeout=timeout) as r, open(tmp, 'wb') as f:
                    shutil.copyfileobj(r, f)
            except (urllib.error.URLError, OSError) as e:
                reason = getattr(e, 'reason', None) or e
                raise ValueError(
                    f'cannot download {url} ({reason}); offline? copy the file from another '
                    f'machine and run: python scripts/get_data.py {name} --from=FILE'
                ) from None
            origin = url
        got = sha256(tmp)
        if got != want:
            raise ValueError(
                f'{origin} has SHA-256 {got}, not the expected {want}: not the {name} file'
            )
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a file opened for writing (the temporary is 0600)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return target


def main(argv: list[str]) -> None:
    if len(argv) != 2:
        print(f'error: name one data set: {", ".join(sorted(DATASETS))}', file=sys.stderr)
        sys.exit(2)
    try:
        path = fetch(argv[1], _FROM.value, _OUT.value, _TIMEOUT.value)
    except ValueError as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(1)
    print(f'{path} ({os.path.getsize(path):,} bytes, SHA-256 verified)')


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing with a bad flag as one line and `--help` exiting 0 (this script does not
    import lm, so it starts without JAX)."""
    try:
        return flags.FLAGS(argv)
    except SystemExit:
        if {'--help', '-help', '-?', '--helpshort', '--helpfull'} & set(argv[1:]):
            sys.exit(0)
        raise
    except flags.Error as e:
        print(f'error: {e}', file=sys.stderr)
        sys.exit(1)


if __name__ == '__main__':
    app.run(main, flags_parser=parse_flags)
