"""The examples, run as README.md runs them: two ranks through ``ringtrain-run``, with a timeout."""

import os
import re
import sys
from pathlib import Path

import pytest
from mpi_launch import launch

pytestmark = pytest.mark.mpi

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "3"}


def _run(tmp_path, script, *args, timeout=240, env=None):
    """Run ``examples/script`` at -np 2; return rank 0's stdout lines, failing on a bad exit."""
    env = dict(os.environ, **QUIET, **(env or {}))
    argv = [sys.executable, "-m", "ringtrain.runner", "-np", "2", sys.executable]
    done, _ = launch([*argv, str(EXAMPLES / script), *args], timeout, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    prefix = "[1,0]<stdout>:"
    return [
        line[len(prefix) :].strip() for line in done.stdout.splitlines() if line.startswith(prefix)
    ]


def _accuracy(lines):
    found = [re.search(r"test accuracy (\d\.\d+)", line) for line in lines]
    values = [float(m.group(1)) for m in found if m]
    assert len(values) == 1, lines[-20:]
    return values[0]


def test_allreduce_demo(tmp_path):
    lines = _run(tmp_path, "allreduce_demo.py")
    assert any("allgather rows per rank [1, 2]" in line for line in lines), lines


@pytest.mark.parametrize(
    ("backend", "module"), [("tensorflow", "tensorflow"), ("jax", "jax"), ("torch", "torch")]
)
def test_keras_mnist_learns_the_digits_on_every_backend(tmp_path, backend, module):
    pytest.importorskip("sklearn")
    pytest.importorskip(module)
    lines = _run(tmp_path, "keras_mnist.py", env={"KERAS_BACKEND": backend})
    assert _accuracy(lines) >= 0.95, lines[-5:]
    assert any(f"on 2 rank(s) on {backend}" in line for line in lines), lines[-5:]


def test_custom_loop_learns_the_digits(tmp_path):
    pytest.importorskip("sklearn")
    lines = _run(tmp_path, "tf2_custom_loop.py")
    assert _accuracy(lines) >= 0.85, lines[-5:]


def test_synthetic_benchmark_reports_images_per_second(tmp_path):
    pytest.importorskip("tensorflow")
    args = ["--model", "mlp", "--num-warmup-batches", "1", "--num-batches-per-iter", "2"]
    lines = _run(tmp_path, "synthetic_benchmark.py", *args, "--num-iters", "3")
    assert any(re.search(r"img/sec", line) for line in lines), lines


def test_elastic_example_learns_the_digits(tmp_path):
    pytest.importorskip("sklearn")
    listing = tmp_path / "hosts"
    listing.write_text("localhost:2\n")
    env = dict(os.environ, DISCOVER_HOSTS_FILE=str(listing), **QUIET)
    argv = [sys.executable, "-m", "ringtrain.runner", "-np", "2", "--min-np", "1"]
    argv += ["--host-discovery-script", str(REPO / "hostfiles/discover-hosts.sh")]
    argv += [sys.executable, str(EXAMPLES / "keras_elastic.py"), "--epochs", "5"]
    done, _ = launch(argv, 240, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "generation 0: 2 ranks on localhost:2" in done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("[1,0]<stdout>:")]
    assert _accuracy(lines) >= 0.9, lines[-5:]
    assert any("after 5 epochs, the last ones on 2 rank(s)" in line for line in lines), lines[-5:]
