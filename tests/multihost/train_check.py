"""Run on every rank of a multi-host job: check the topology, allreduces and a short training.

Usage: ``train_check.py HOST:SLOTS,...``, the hosts the job was launched on, filled slot by
slot. Each rank regenerates every rank's data from its seed, so every result is compared with
NumPy on the full data. A failed check raises, which ends the whole job.
"""

import socket
import sys

import numpy as np

import ringtrain


def main() -> None:
    """Run the checks and print one line per rank when they pass."""
    ringtrain.init()
    try:
        _check_topology(_expected_topology(sys.argv[1], ringtrain.rank()))
        _check_allreduce()
        _check_process_sets()
        _check_training()
        print(f"rank {ringtrain.rank()} on {socket.gethostname()}: all checks passed", flush=True)
    finally:
        ringtrain.shutdown()


def _expected_topology(layout, rank):
    hosts = [(name, int(slots)) for name, slots in (item.split(":") for item in layout.split(","))]
    placement = [(name, local, slots) for name, slots in hosts for local in range(slots)]
    host, local_rank, local_size = placement[rank]
    peers = [other for other, place in enumerate(placement) if place[1] == local_rank]
    return {
        "host": host,
        "size": len(placement),
        "local_rank": local_rank,
        "local_size": local_size,
        "cross_rank": peers.index(rank),
        "cross_size": len(peers),
    }


def _check_topology(expected):
    actual = {
        "host": socket.gethostname(),
        "size": ringtrain.size(),
        "local_rank": ringtrain.local_rank(),
        "local_size": ringtrain.local_size(),
        "cross_rank": ringtrain.cross_rank(),
        "cross_size": ringtrain.cross_size(),
    }
    assert actual == expected, f"rank {ringtrain.rank()}: topology {actual} != {expected}"


def _rank_data(rank, length=1001):
    return np.random.default_rng(rank).standard_normal(length)


def _check_allreduce():
    size, rank = ringtrain.size(), ringtrain.rank()
    everyone = np.stack([_rank_data(other) for other in range(size)])
    total = ringtrain.allreduce(_rank_data(rank), op=ringtrain.Sum, name="check.sum")
    np.testing.assert_allclose(total, everyone.sum(axis=0), rtol=1e-12, atol=1e-12)
    mean = ringtrain.allreduce(_rank_data(rank), op=ringtrain.Average, name="check.mean")
    np.testing.assert_allclose(mean, everyone.mean(axis=0), rtol=1e-12, atol=1e-12)
    counts = ringtrain.allreduce(np.arange(7, dtype=np.int64) * (rank + 1), op=ringtrain.Sum)
    np.testing.assert_array_equal(counts, np.arange(7) * (size * (size + 1) // 2))


def _check_process_sets():
    """Reduce over sets across hosts: ranks 0, 1 and 3 (two on the first host), and 1 and 2."""
    rank = ringtrain.rank()
    sets = [ringtrain.add_process_set([0, 1, 3]), ringtrain.add_process_set([1, 2])]
    for process_set in sets:
        if process_set.included():
            everyone = np.stack([_rank_data(member, 501) for member in process_set.ranks])
            total = ringtrain.allreduce(
                _rank_data(rank, 501), op=ringtrain.Sum, process_set=process_set
            )
            np.testing.assert_allclose(total, everyone.sum(axis=0), rtol=1e-12, atol=1e-12)
    for process_set in sets:
        assert ringtrain.remove_process_set(process_set)


def _regression_data(rows=203, features=5):
    rng = np.random.default_rng(1234)
    x = rng.standard_normal((rows, features))
    y = x @ rng.standard_normal(features) + 0.01 * rng.standard_normal(rows)
    return x, y


def _descend(gradient, features, steps=60, learning_rate=0.5):
    weights = np.zeros(features)
    for step in range(steps):
        weights = weights - learning_rate * gradient(weights, step)
    return weights


def _check_training():
    x, y = _regression_data()
    mine = np.array_split(np.arange(len(y)), ringtrain.size())[ringtrain.rank()]
    xs, ys = x[mine], y[mine]

    def averaged(weights, step):
        local = xs.T @ (xs @ weights - ys)
        return ringtrain.allreduce(local, op=ringtrain.Sum, name=f"grad.{step}") / len(y)

    def serial(weights, step):
        return x.T @ (x @ weights - y) / len(y)

    trained = _descend(averaged, x.shape[1])
    np.testing.assert_allclose(trained, _descend(serial, x.shape[1]), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(trained, np.linalg.lstsq(x, y, rcond=None)[0], atol=1e-6)
    every = ringtrain.allgather(trained[None, :], name="weights")
    assert (every == every[0]).all(), f"ranks ended with different weights:\n{every}"


if __name__ == "__main__":
    main()
