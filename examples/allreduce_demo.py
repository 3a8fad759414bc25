"""A 2-rank tour of ringtrain's NumPy API: every rank prints what it sent and got.

Run:  python3 -m ringtrain.runner -np 2 python3 examples/allreduce_demo.py
  or: mpirun -np 2 python3 examples/allreduce_demo.py
"""

import numpy as np

import ringtrain  # ringtrain:

ringtrain.init()  # ringtrain:
rank, size = ringtrain.rank(), ringtrain.size()  # ringtrain:

# Each rank holds its own gradient-like data.
grad = np.arange(5, dtype=np.float32) * (rank + 1)
mean = ringtrain.allreduce(grad, op=ringtrain.Average, name="grad")  # ringtrain:
total = ringtrain.allreduce(grad, op=ringtrain.Sum, name="grad.sum")  # ringtrain:
expected = sum(np.arange(5, dtype=np.float32) * (r + 1) for r in range(size))
assert np.allclose(total, expected) and np.allclose(mean, expected / size)

# Many small tensors submitted at once are fused into one ring allreduce.
handles = [
    ringtrain.allreduce_async(
        np.full(3, rank + i, np.float64),
        name=f"layer{i}",  # ringtrain:
        op=ringtrain.Sum,
    )
    for i in range(8)
]
sums = [ringtrain.synchronize(h) for h in handles]  # ringtrain:

rows = ringtrain.allgather(np.full((rank + 1, 2), rank, np.int32))  # ringtrain:
weights = ringtrain.broadcast(np.random.default_rng(rank).random(3), root_rank=0)  # ringtrain:

print(
    f"rank {rank}/{size}: sent {grad.tolist()}\n"
    f"  average {mean.tolist()}  sum {total.tolist()}\n"
    f"  8 fused tensors, first sums {[float(s[0]) for s in sums]}\n"
    f"  allgather rows per rank {[int((rows[:, 0] == r).sum()) for r in range(size)]}\n"
    f"  broadcast from rank 0 {np.round(weights, 4).tolist()}",
    flush=True,
)
ringtrain.shutdown()  # ringtrain:
