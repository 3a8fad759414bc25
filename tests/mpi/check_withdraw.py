"""Withdrawals that race the responses taking the same names, then the names submitted again.

Every round each rank submits three tensors, waits a random moment of its own, and takes
them back with ``api.withdraw(..., agree_as=...)``, as a failed training step does. A tensor
that the coordinator had already decided runs on every rank and must hold the right sum;
one that was withdrawn fails with a "withdrawn" error. Then every rank submits the same
names again at once: they must pair with each other, never with a slower rank's earlier
submission (without the agreement, that gave wrong sums at -np 3 and a stall at -np 2).
"""

import random
import time

import numpy as np
from common import main

import ringtrain
from ringtrain import api
from ringtrain.errors import RingtrainError

ROUNDS = 200


def body():
    ringtrain.init()
    rank, size = ringtrain.rank(), ringtrain.size()
    pause = random.Random(rank * 7919 + 1)
    outcomes = {"ran": 0, "withdrawn": 0}
    for i in range(ROUNDS):
        data = np.full(5, float(rank + 10 * i))
        total = float(sum(q + 10 * i for q in range(size)))
        names = [f"w.{k}" for k in range(3)]
        handles = [ringtrain.allreduce_async(data, name=n, op=ringtrain.Sum) for n in names]
        time.sleep(pause.choice([0, 0, 1e-5, 1e-4, 5e-4, 2e-3]))
        api.withdraw(handles, agree_as=f"w.withdrawn.{i % 2}")
        for handle in handles:
            assert handle.done(), (rank, i)
            try:
                result = ringtrain.synchronize(handle)
            except RingtrainError as err:
                assert "withdrawn" in str(err), err
                outcomes["withdrawn"] += 1
            else:
                assert np.array_equal(result, np.full(5, total)), (rank, i, result)
                outcomes["ran"] += 1
        again = [ringtrain.allreduce(2 * data, name=n, op=ringtrain.Sum) for n in names]
        for result in again:
            assert np.array_equal(result, np.full(5, 2 * total)), (rank, i, result)
    print(f"rank {rank}: {outcomes['ran']} ran, {outcomes['withdrawn']} withdrawn", flush=True)
    ringtrain.shutdown()


if __name__ == "__main__":
    main(body)
