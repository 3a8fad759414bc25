"""Autotune without MPI: its settings, space, search, steps, log, memory and whole run."""

import csv
import json
import math
import shlex
import warnings

import pytest

from ringtrain import settings
from ringtrain.engine import messages
from ringtrain.engine.messages import Meta
from ringtrain.engine.negotiation import Coordinator
from ringtrain.engine.stall import StallInspector
from ringtrain.engine.tuning import space, tuner
from ringtrain.engine.tuning.confirm import SAMPLES_EACH, Confirmation
from ringtrain.engine.tuning.memory import TuningMemory, job_key
from ringtrain.engine.tuning.search import Search
from ringtrain.engine.tuning.steps import StepClock, signature
from ringtrain.runner import exports
from ringtrain.topology import Topology

START = space.current(settings.read({}), hierarchical=False)


class Clock:
    """A clock that moves only when told to."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        """Return the time now, in seconds."""
        return self.now


def _meta(name, length=1000):
    return Meta(name, messages.ALLREDUCE, "float32", (length,))


# -- settings ------------------------------------------------------------------------


def test_autotune_settings_read_horovods_variables_where_ours_are_unset():
    read = settings.read({"HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": "/tmp/h.csv"})
    assert read.autotune is True and read.autotune_log == "/tmp/h.csv"
    assert read.user_set == {"autotune", "autotune_log"}
    ours = settings.read({"RINGTRAIN_AUTOTUNE": "0", "HOROVOD_AUTOTUNE": "1"})
    assert ours.autotune is False
    counts = settings.read(
        {"HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "7", "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "3"}
    )
    assert (counts.autotune_samples, counts.autotune_steps_per_sample) == (7, 3)
    with pytest.raises(ValueError, match="bad value 'x' for HOROVOD_AUTOTUNE: expected one of"):
        settings.read({"HOROVOD_AUTOTUNE": "x"})
    with pytest.raises(ValueError, match="RINGTRAIN_AUTOTUNE_SAMPLES: expected a number >= 1"):
        settings.read({"RINGTRAIN_AUTOTUNE_SAMPLES": "0"})


def test_user_set_names_what_the_environment_and_keywords_gave():
    read = settings.read({"RINGTRAIN_RING_CHUNK_BYTES": "65536"}, fusion_threshold=1 << 20)
    assert read.user_set == {"ring_chunk_bytes", "fusion_threshold"}
    assert settings.read({}, cycle_time_ms=None).user_set == frozenset()  # None: left as it was


def test_ringtrain_run_exports_autotune_and_its_log():
    env = exports.settings_env({}, autotune=True, autotune_log_file="/tmp/tune.csv")
    assert env == {"RINGTRAIN_AUTOTUNE": "1", "RINGTRAIN_AUTOTUNE_LOG": "/tmp/tune.csv"}
    assert exports.settings_env({}, autotune=False, autotune_log_file=None) == {}


# -- the space -----------------------------------------------------------------------


def test_the_defaults_are_among_the_choices_so_the_first_sample_is_the_start():
    for field, value in START.items():
        assert value in space.BY_FIELD[field].choices, field


def test_tuned_fields_leave_out_what_the_user_set_and_what_cannot_switch():
    assert space.tuned_fields(frozenset(), True) == space.FIELDS
    fields = space.tuned_fields({"fusion_threshold", "cache_capacity"}, False)
    assert fields == ("cycle_time_ms", "ring_chunk_bytes")


def test_the_largest_chunk_holds_the_tuners_largest_unless_the_user_set_one():
    assert space.largest_chunk(settings.read({}, autotune=True)) == 4 << 20
    assert space.largest_chunk(settings.read({}, autotune=True, ring_chunk_bytes=4096)) == 4096
    assert space.largest_chunk(settings.read({})) == 1 << 20


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1, 2], "expected a mapping of settings, got list"),
        ({**START, "ring_chunk_bytes": 3000}, "ring_chunk_bytes=3000 is not one of"),
        ({**START, "response_cache": 1}, "response_cache=1 is not one of"),
        ({k: v for k, v in START.items() if k != "cycle_time_ms"}, "no value for cycle_time_ms"),
    ],
)
def test_values_read_back_are_checked_against_the_choices(values, message):
    with pytest.raises(ValueError, match=message):
        space.checked(values, space.FIELDS)


# -- the search ----------------------------------------------------------------------


def _synthetic_score(values):
    """Return a score peaked at 256 KiB chunks, 4 MiB fusion, the cache on and flat (log2 units)."""
    return (
        10.0
        - abs(math.log2(values["ring_chunk_bytes"]) - 18)
        - 0.5 * abs(math.log2(values["fusion_threshold"]) - 22)
        + (1.0 if values["response_cache"] else 0.0)
        - (2.0 if values["hierarchical_allreduce"] else 0.0)
    )


def test_the_search_starts_from_the_start_then_every_switch_flipped_then_improves():
    search = Search(space.FIELDS, START, seed=3)
    samples = []
    for _ in range(20):
        values = search.ask()
        samples.append(values)
        search.tell(_synthetic_score(values))
    assert samples[0] == START
    flipped = {"hierarchical_allreduce": True, "response_cache": False}
    assert samples[1] == {**START, **flipped}
    best, score = search.best()
    assert score == max(map(_synthetic_score, samples)) == _synthetic_score(best)
    assert score >= _synthetic_score(START) + 2.0, (best, score)  # the start scores 7.0


# -- steps ---------------------------------------------------------------------------


def test_a_step_ends_where_a_name_comes_back_and_only_whole_steps_are_timed():
    clock = Clock()
    steps = StepClock(clock)
    step = [[_meta("a"), _meta("b")], [_meta("c", 500)]]  # 10,000 bytes a step
    boundaries = []
    for _ in range(4):
        for metas in step:
            boundaries.append(steps.ran(metas))
            clock.now += 0.5
    assert boundaries == [False, False, True, False, True, False, True, False]
    assert steps.steps == 2  # timing started at the first boundary (step 2)
    assert steps.score() == pytest.approx(10_000 / 1.0)  # a step a second
    for number, metas in enumerate(step * 3):  # one step of 10 s, then steps of 1 s
        steps.ran(metas)
        clock.now += 9.5 if number == 0 else 0.5
    assert steps.steps == 5 and steps._timed[3] == (10_000, 10.0)
    assert steps.score() == pytest.approx(10_000 / 1.0)  # the median step's: 1 s, not 10
    assert [m.name for m in steps.last_step] == ["a", "b", "c"]
    steps.restart()
    assert steps.steps == 0 and steps.score() == 0.0


def test_the_signature_names_the_tensors_not_their_order():
    a, b = _meta("a"), _meta("b", 7)
    assert signature([a, b]) == signature([b, a]) != signature([a, b._replace(shape=(8,))])


# -- the whole run -------------------------------------------------------------------


def _run_job(tuner_, clock, cost, steps_at_most):
    """Drive ``tuner_`` with a 3-tensor step whose seconds are ``cost(settings)``.

    Settings switch as soon as the tuner returns them; returns the steps run and every
    switch.
    """
    applied = dict(tuner_.start)
    switches = []
    step = [[_meta("w0"), _meta("w1")], [_meta("w2", 3000)]]
    for number in range(steps_at_most):
        for metas in step:
            values = tuner_.ran(metas)
            if values is not None:
                applied = values
                switches.append(values)
        clock.now += cost(applied)
        if tuner_.done:
            return number + 1, switches, applied
    return steps_at_most, switches, applied


def _tuned(tmp_path, **overrides):
    chosen = settings.read(
        {},
        autotune=True,
        autotune_log=str(tmp_path / "tune.csv"),
        autotune_cache=str(tmp_path / "tune.json"),
        **overrides,
    )
    return chosen


def _key(model):
    topology = Topology(0, 2, 0, 2, 0, 1, (0, 0), ("h", "h"), (0, 1))
    return job_key(model, topology, None)


def _cost(values):
    return 1.0 / max(_synthetic_score(values), 0.5)


def test_a_run_warms_up_samples_switches_to_the_best_logs_and_remembers(tmp_path):
    chosen = _tuned(tmp_path)
    clock = Clock()
    run = tuner.Tuner(chosen, space.FIELDS, START, _key, clock)
    steps, switches, applied = _run_job(run, clock, _cost, 400)
    per, searched = chosen.autotune_steps_per_sample, chosen.autotune_samples
    samples = searched + 2 * SAMPLES_EACH  # the search's, then the confirmation's
    assert run.done and run.sampled == samples
    assert steps <= 200, steps  # within the first 200 steps of a job, with the defaults
    # A step ends as the next begins, and a sample's timing starts at a step's start.
    assert steps == chosen.autotune_warmup_samples * per + 2 + samples * (per + 1)
    assert steps == tuner.steps_to_tune(chosen)
    assert len(switches) == samples + 1 and switches[0] == START
    with open(tmp_path / "tune.csv") as file:
        rows = list(csv.DictReader(file))
    assert [row["sample"] for row in rows] == [*map(str, range(1, samples + 1)), "best"]
    scores = [float(row["score_bytes_per_second"]) for row in rows[:-1]]
    best = rows[-1]
    # The confirmation times the start and the search's best in turn: start, best, best, start.
    confirming = [{f: row[f] for f in space.FIELDS} for row in rows[searched:-1]]
    start, found = confirming[0], confirming[1]
    assert confirming == [start, found, found, start] and start == {
        f: str(v) for f, v in START.items()
    }
    assert float(best["score_bytes_per_second"]) == pytest.approx(max(scores[:searched]))
    assert applied == switches[-1] and all(best[f] == str(applied[f]) for f in space.FIELDS)
    assert all(best[f] == found[f] for f in space.FIELDS)
    assert _cost(applied) < _cost(START) / 1.25, applied  # the defaults score 7, the peak 11

    again = tuner.Tuner(chosen, space.FIELDS, START, _key, clock)
    steps, switches, remembered = _run_job(again, clock, _cost, 400)
    assert again.done and again.sampled == 0 and remembered == applied
    assert steps == chosen.autotune_warmup_samples * per + 2 and len(switches) == 1


def test_a_best_that_beats_the_start_by_less_than_the_margin_leaves_the_start(tmp_path):
    clock = Clock()
    run = tuner.Tuner(_tuned(tmp_path, autotune_samples=6), space.FIELDS, START, _key, clock)
    faster = 1.015  # every other setting, by less than the margin
    assert tuner.KEEP_START_MARGIN > faster - 1

    def cost(values):
        return 1.0 if values == START else 1.0 / faster

    _, switches, applied = _run_job(run, clock, cost, 200)
    assert run.done and len(switches) == 7 and switches[1] != START
    assert applied == run.best == START
    with open(tmp_path / "tune.csv") as file:
        best = list(csv.DictReader(file))[-1]
    assert best["sample"] == "best" and all(best[f] == str(START[f]) for f in space.FIELDS)


def test_a_best_sample_that_was_only_lucky_loses_the_confirmation_and_the_start_stays(tmp_path):
    clock = Clock()
    chosen = _tuned(tmp_path, autotune_samples=6)
    run = tuner.Tuner(chosen, space.FIELDS, START, _key, clock)
    lucky = {"sample": None}

    def cost(values):
        # Every setting takes 1 s a step, but the third sample's ran 10% faster, once.
        if run.sampled == 2 and values != START:
            lucky["sample"] = dict(values)
            return 1.0 / 1.1
        return 1.0

    steps, switches, applied = _run_job(run, clock, cost, 400)
    assert run.done and run.sampled == 6 + 2 * SAMPLES_EACH and steps == tuner.steps_to_tune(chosen)
    assert switches[6:-1] == [START, lucky["sample"], lucky["sample"], START], switches
    assert applied == run.best == START
    with open(tmp_path / "tune.csv") as file:
        best = list(csv.DictReader(file))[-1]
    assert all(best[f] == str(START[f]) for f in space.FIELDS)
    step_bytes = (1000 + 1000 + 3000) * 4  # float32s, a step a second: the start's fresh score
    assert float(best["score_bytes_per_second"]) == pytest.approx(step_bytes)


def test_the_confirmation_keeps_the_best_only_if_its_fresh_samples_beat_the_start_by_the_margin():
    start, best = {"x": 0}, {"x": 1}
    order = []
    cases = (
        ([2.0, 1.0, 1.0, 2.0], start, 2.0),
        ([2.0, 2.5, 1.9, 2.0], best, 2.2),  # 10% higher
        ([2.0, 2.05, 2.03, 2.0], start, 2.0),  # 2% higher, under the margin of 3%
        ([2.0, 2.07, 2.07, 2.0], best, 2.07),  # 3.5% higher
    )
    for scores, winner, mean in cases:
        confirmation = Confirmation(start, best, 0.03)
        order = []
        for score in scores:
            order.append(confirmation.next())
            confirmation.tell(score)
        assert confirmation.next() is None
        values, score = confirmation.winner()
        assert values == winner and score == pytest.approx(mean)
    assert order == [start, best, best, start]
    tie = Confirmation(start, best, 0.0)
    for _ in range(2 * SAMPLES_EACH):
        tie.next()
        tie.tell(1.0)
    assert tie.winner() == (start, 1.0)  # a tie keeps the start


def _with_the_users_chunk(tmp_path, samples):
    """Return a tuner on one host whose user set a ring chunk of 192 KiB, its clock and start."""
    chosen = _tuned(tmp_path, ring_chunk_bytes=3 << 16, autotune_samples=samples)
    fields = space.tuned_fields(chosen.user_set, False)
    start = space.current(chosen, False)
    clock = Clock()
    return tuner.Tuner(chosen, fields, start, _key, clock), clock, start


def test_a_user_set_value_is_left_alone_through_every_sample(tmp_path):
    run, clock, _ = _with_the_users_chunk(tmp_path, 6)
    _, switches, _ = _run_job(run, clock, lambda v: 1.0, 200)
    assert run.done and {s["ring_chunk_bytes"] for s in switches} == {3 << 16}
    assert {s["hierarchical_allreduce"] for s in switches} == {False}


def test_a_job_whose_user_set_every_tuned_value_settles_on_them_without_a_switch(tmp_path):
    from ringtrain.bench import autotune_job

    values = {"fusion_threshold": 1 << 20, "cycle_time_ms": 0.5, "ring_chunk_bytes": 1 << 18}
    chosen = _tuned(tmp_path, **values, cache_capacity=1024)
    fields = space.tuned_fields(chosen.user_set, False)
    assert fields == ()
    start = space.current(chosen, False)
    clock = Clock()
    run = tuner.Tuner(chosen, fields, start, _key, clock)
    steps, switches, applied = _run_job(run, clock, lambda v: 1.0, 200)
    assert run.done and run.sampled == 0 and switches == [] and run.best == start == applied
    assert steps == chosen.autotune_warmup_samples * chosen.autotune_steps_per_sample + 2
    assert autotune_job._settings_to_time(run, steps).startswith(
        "the sweep switches fusion_threshold, ring_chunk_bytes, response_cache, which"
    )


def test_a_switch_once_tuned_takes_any_tuned_value_and_refuses_the_rest(tmp_path):
    run, clock, start = _with_the_users_chunk(tmp_path, 2)
    other = {**start, "fusion_threshold": 1 << 16, "response_cache": False}
    with pytest.raises(ValueError, match="still tuning"):
        run.switch(other)
    _run_job(run, clock, lambda v: 1.0, 200)
    assert run.done and run.best is not None and run.switch(other) == other
    with pytest.raises(ValueError, match=r"cannot change \{'ring_chunk_bytes': 65536\}"):
        run.switch({**other, "ring_chunk_bytes": 1 << 16})
    with pytest.raises(ValueError, match="hierarchical_allreduce"):
        run.switch({**other, "hierarchical_allreduce": True})
    with pytest.raises(ValueError, match=r"fusion_threshold=12345 is not one of"):
        run.switch({**other, "fusion_threshold": 12345})
    with pytest.raises(ValueError, match="no value for cycle_time_ms"):
        run.switch({k: v for k, v in other.items() if k != "cycle_time_ms"})


def test_a_job_whose_names_never_come_back_stops_tuning_with_a_warning(tmp_path):
    run = tuner.Tuner(_tuned(tmp_path), space.FIELDS, START, _key, Clock())
    with pytest.warns(UserWarning, match="without a name coming back"):
        for number in range(tuner.GIVE_UP_RESPONSES):
            assert run.ran([_meta(f"t{number}")]) is None
    assert run.done


# -- the memory ----------------------------------------------------------------------


def test_remembered_settings_come_back_for_their_key_only(tmp_path):
    path = tmp_path / "memory.json"
    memory = TuningMemory(str(path))
    best = {**START, "ring_chunk_bytes": 1 << 18}
    memory.remember(_key("m1"), best, 123.0)
    memory.remember(_key("m2"), START, 99.0)
    memory.remember(_key("m1"), {**best, "cycle_time_ms": 0.05}, 130.0)  # replaces m1's
    again = TuningMemory(str(path))
    assert again.recall(_key("m1")) == {**best, "cycle_time_ms": 0.05}
    assert again.recall(_key("m2")) == START and again.recall(_key("m3")) is None
    data = json.loads(path.read_text())
    assert data["format"] == "ringtrain-autotune" and len(data["jobs"]) == 2


def test_the_key_holds_ranks_per_host_and_the_links_rate_class():
    topology = Topology(0, 3, 0, 2, 0, 2, (0, 0, 2), ("a", "a", "b"), (0, 1, 2))
    key = job_key("m", topology, 0.93e9 / 8)
    assert key == {"model": "m", "size": 3, "ranks_per_host": [1, 2], "link_gbit_per_s": 1.0}
    assert job_key("m", topology, 6.5e9 / 8)["link_gbit_per_s"] == 10.0


def test_a_cache_that_cannot_be_written_is_warned_about_and_nothing_raises(tmp_path):
    memory = TuningMemory(str(tmp_path / "missing" / "memory.json"))
    with pytest.warns(UserWarning, match="the tuned settings are not remembered"):
        memory.remember(_key("m"), START, 1.0)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "cannot be read as JSON"),
        ('["a", "list"]', "is not a ringtrain-autotune file"),
        ('{"format": "someone-else", "jobs": []}', "is not a ringtrain-autotune file"),
        ('{"format": "ringtrain-autotune", "version": 99, "jobs": []}', "expected version 1"),
    ],
)
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_never_written(tmp_path, text, why):
    path = tmp_path / "memory.json"
    path.write_text(text)
    with pytest.warns(UserWarning, match=why):
        memory = TuningMemory(str(path))
    assert memory.recall(_key("m")) is None
    with pytest.warns(UserWarning, match="not remembered"):
        memory.remember(_key("m"), START, 1.0)
    assert path.read_text() == text


def test_an_entry_with_a_wrong_value_is_ignored_and_the_others_kept(tmp_path):
    path = tmp_path / "memory.json"
    good = {"key": _key("good"), "settings": START}
    bad = {"key": _key("bad"), "settings": {**START, "fusion_threshold": -1}}
    data = {"format": "ringtrain-autotune", "version": 1, "jobs": [bad, good, "junk"]}
    path.write_text(json.dumps(data))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        memory = TuningMemory(str(path))
    texts = [str(w.message) for w in caught]
    assert any("job 0" in t and "fusion_threshold=-1" in t for t in texts), texts
    assert any("job 2" in t for t in texts), texts
    assert memory.recall(_key("bad")) is None and memory.recall(_key("good")) == START


# -- the coordinator's side of a switch ------------------------------------------------


def test_the_coordinator_plans_with_the_new_threshold_and_a_cache_turned_off_evicts():
    coord = Coordinator(2, 1 << 20, 16, StallInspector(60.0, None))
    for rank in range(2):
        coord.add(rank, [_meta("a", 100), _meta("b", 100)])
    (fused,) = coord.responses()
    assert fused.names == ["a", "b"] and set(fused.cache_ids) == {"a", "b"}
    coord.retune(400, 0)  # 400 bytes: one tensor a fusion; no cache
    (evicted,) = coord.responses()
    assert evicted.kind == messages.EVICTED and set(evicted.cache_ids) == {"a", "b"}
    for rank in range(2):
        coord.add(rank, [_meta("a", 100), _meta("b", 100)])
    responses = coord.responses()
    assert [r.names for r in responses] == [["a"], ["b"]]
    assert all(r.cache_ids == {} for r in responses)
    coord.retune(1 << 20, 16)
    for rank in range(2):
        coord.add(rank, [_meta("a", 100)])
    assert coord.responses()[0].cache_ids == {"a": 2}


# -- the benchmark's plan ------------------------------------------------------------------


def test_the_benchmarks_warmup_outlasts_tuning_and_its_sweep_points_are_valid_settings():
    from ringtrain.bench import autotune

    env = {"RINGTRAIN_AUTOTUNE_SAMPLES": "5", "RINGTRAIN_AUTOTUNE_STEPS_PER_SAMPLE": "3"}
    samples = 5 + 2 * SAMPLES_EACH  # the search's and the confirmation's
    assert autotune.warmup_steps(env) == 1 * 3 + 2 + samples * (3 + 1) + 20
    points = autotune.sweep_values(START)
    assert len({tuple(sorted(p.items())) for p in points.values()}) == len(points) == 8
    assert "fusion 1 MiB, chunk 4096 KiB, cache off" in points
    for values in points.values():
        assert space.checked(values, space.FIELDS) == values
        assert {f for f in START if values[f] != START[f]} <= set(autotune.SWEEP)


def test_ringtrain_run_passes_autotune_and_its_log_to_every_rank(capsys):
    from ringtrain.runner import cli

    argv = ["-np", "2", "-H", "node1:2", "--autotune", "--autotune-log-file", "/tmp/t.csv"]
    assert cli.main([*argv, "--dry-run", "python", "train.py"]) == 0
    words = shlex.split(capsys.readouterr().out)
    exported = [words[i + 1] for i, word in enumerate(words) if word == "-x"]
    assert "RINGTRAIN_AUTOTUNE=1" in exported
    assert "RINGTRAIN_AUTOTUNE_LOG=/tmp/t.csv" in exported
