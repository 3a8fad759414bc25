"""An elastic NumPy job for tests/test_elastic.py, run by ``ringtrain-run --host-discovery-script``.

Each step averages rank-distinct gradients and takes an SGD step; the state keeps the weights
and every step's (step, world size, launch), so the test can replay the run in NumPy. Environment:

- ELASTIC_STEPS, ELASTIC_COMMIT_EVERY: the steps, and a commit after every that many;
- ELASTIC_OUT: the JSON file that rank 0 writes at the end;
- ELASTIC_TAG: put before the generation to name a launch in the history ("a" gives a0, a1);
- ELASTIC_CRASH ``generation:step:rank``: that rank dies there without a word (``*``: in
  every generation);
- ELASTIC_FREEZE ``generation:step:rank``: that rank freezes there (SIGSTOP), as a hung
  host would, until the job ends it;
- ELASTIC_LOSE ``generation:step:rank:peer``: that rank says (``contract.unreachable_line``)
  that rank ``peer`` stopped answering, and exits with status 3;
- ELASTIC_HOSTS ``generation:step:file:host:N,...``: there rank 0 writes those hosts to the
  file that the discovery script prints;
- ELASTIC_SLOW: seconds that each step sleeps (with ELASTIC_HOSTS, from its step on).
"""

import json
import os
import signal
import sys
import time

import numpy as np

import ringtrain
from ringtrain import contract, settings

LENGTH = 37


def gradient(rank, step):
    """Return rank ``rank``'s gradient at ``step`` (the test computes the same)."""
    return np.random.default_rng([rank, step]).standard_normal(LENGTH)


def _at(spec, generation, step):
    """Return the fields after ``generation:step:`` in ``spec`` if they name this point."""
    fields = spec.split(":", 2) if spec else []
    if len(fields) == 3 and fields[0] in ("*", str(generation)) and fields[1] == str(step):
        return fields[2]
    return None


def main():
    steps = int(os.environ["ELASTIC_STEPS"])
    every = int(os.environ["ELASTIC_COMMIT_EVERY"])
    generation = settings.elastic_launch().generation
    crash = os.environ.get("ELASTIC_CRASH", "")
    lose = os.environ.get("ELASTIC_LOSE", "")
    freeze = os.environ.get("ELASTIC_FREEZE", "")
    hosts = os.environ.get("ELASTIC_HOSTS", "")
    slow = float(os.environ.get("ELASTIC_SLOW", "0"))
    launch = os.environ.get("ELASTIC_TAG", "") + str(generation)
    ringtrain.init()
    # Rank-distinct starting weights: ``run`` gives every rank rank 0's (zeros).
    start = np.full(LENGTH, float(ringtrain.rank()))
    state = ringtrain.elastic.ObjectState(step=0, weights=start, history=[])
    resets = []
    state.register_reset_callbacks([lambda: resets.append(ringtrain.size())])
    changed = []

    @ringtrain.elastic.run
    def train(state):
        weights = ringtrain.allgather_object(state.weights.tolist())
        assert all(w == weights[0] for w in weights), "run did not give every rank rank 0's state"
        while state.step < steps:
            if _at(crash, generation, state.step) == str(ringtrain.rank()):
                os._exit(3)
            if _at(freeze, generation, state.step) == str(ringtrain.rank()):
                os.kill(os.getpid(), signal.SIGSTOP)
            lost = (_at(lose, generation, state.step) or ":").split(":")
            if lost[0] == str(ringtrain.rank()):
                print(contract.unreachable_line(int(lost[1]), "elsewhere"), file=sys.stderr)
                sys.exit(3)
            new_hosts = _at(hosts, generation, state.step)
            if new_hosts is not None and ringtrain.rank() == 0:
                path, listing = new_hosts.split(":", 1)
                with open(path, "w") as file:
                    file.write(listing.replace(",", "\n") + "\n")
                changed.append(state.step)
            grad = gradient(ringtrain.rank(), state.step)
            mean = ringtrain.allreduce(grad, op=ringtrain.Average, name="grad")
            state.weights = state.weights - 0.1 * mean
            state.history.append([state.step, ringtrain.size(), launch])
            state.step += 1
            if state.step % every == 0:
                state.commit()
            if changed or not hosts:
                time.sleep(slow)

    train(state)
    if ringtrain.rank() == 0:
        result = {
            "weights": state.weights.tolist(),
            "history": state.history,
            "resets": resets,
            "generation": generation,
        }
        with open(os.environ["ELASTIC_OUT"], "w") as file:
            json.dump(result, file)


if __name__ == "__main__":
    main()
