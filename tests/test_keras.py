"""``ringtrain.keras`` on each Keras backend under a real mpirun, one small model each."""

import json
import sys
from pathlib import Path

import bounded
import pytest
from mpi_launch import check

pytestmark = pytest.mark.mpi

SCRIPT = Path(__file__).parent / "keras" / "check_keras_backend.py"
BACKENDS = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch"}  # backend -> module


# TensorFlow's binding has its own tests at 1-4 ranks (test_tf.py): here it runs at 2 only.
# JAX's exchange is PyTorch's but for the bridge: it runs at 1 and 2 ranks (the suite's time).
@pytest.mark.parametrize(
    ("backend", "np"),
    [("torch", 1), ("torch", 2), ("torch", 3), ("jax", 1), ("jax", 2), ("tensorflow", 2)],
)
def test_one_step_on_every_rank_equals_one_process_on_every_batch(backend, np):
    pytest.importorskip(BACKENDS[backend])
    env = {"KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
    result = check(str(SCRIPT), np, env=env, timeout=240)
    assert result.stdout.count(f"keras on {backend} ok") == np, result.stdout


# JAX only, which runs every contender PyTorch does and Keras's DataParallel besides, at one
# rank: each run at two cost the suite a minute and a half.
@pytest.mark.parametrize("backend", ["jax"])
def test_training_benchmark_reports_every_contender_on_the_backend(tmp_path, backend):
    pytest.importorskip(BACKENDS[backend])
    out = tmp_path / "rows.json"
    command = [
        sys.executable, "-m", "ringtrain.bench", "train", "--backend", backend, "--models",
        "mlp", "--steps", "4", "--warmup", "2", "--timeout", "150", "--rounds", "1",
        "--np", "1", "--json", str(out),
    ]  # fmt: skip
    done, _ = bounded.run(command, 400)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Keras on {backend}, model.fit" in done.stdout, done.stdout
    rows = json.loads(out.read_text())
    contenders = ["one process", "1 independent processes", "ringtrain -np 1"]
    if backend == "jax":  # Keras 3.15 has DataParallel for JAX alone
        contenders.append("keras DataParallel, 1 devices")
    assert [r["contender"] for r in rows] == contenders
    assert all(r["samples_per_sec"] > 0 for r in rows), rows
    assert rows[0]["scaling_ratio"] == 1.0, rows
    assert rows[2]["hidden_fraction"] is None, rows  # one rank exchanges nothing to hide
