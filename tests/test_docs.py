"""The user docs build with MkDocs in strict mode: no broken link, anchor or API reference."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_docs_build_strict(tmp_path):
    # A tensorflow that cannot be imported: the API pages must come from the source alone.
    blocker = tmp_path / "blocked"
    blocker.mkdir()
    (blocker / "tensorflow.py").write_text("raise ImportError('the docs build imported TF')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(blocker), str(ROOT)]))
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    api_page = (site / "api" / "index.html").read_text()
    assert 'id="ringtrain.allreduce"' in api_page  # the reference was rendered
