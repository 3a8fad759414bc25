"""``python -m ringtrain.timeline``: its figures on traces with known times, its PNG, its errors.

The traces are written by the engine's own writer (``ringtrain.engine.timeline``), so a
change to its format shows up here.
"""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from ringtrain.engine import timeline as tl
from ringtrain.timeline import steps, trace
from ringtrain.timeline.__main__ import main

_MOVES = [
    tl.MEMCPY_IN_FUSION_BUFFER,
    tl.REDUCE_SCATTER,
    tl.ALLGATHER,
    tl.MEMCPY_OUT_FUSION_BUFFER,
]
SITE = "DistributedOptimizer"


def _write(path, events):
    """Write ``events`` (name, phase, start_us[, end_us]) with ringtrain's own writer."""
    timeline = tl.Timeline(str(path), rank=0)
    base = tl.now_ns() + 10**9  # every event after the file's origin
    for name, phase, start, *end in events:
        if phase == tl.ENQUEUE:
            timeline.instant(name, phase, base + round(start * 1000))
        else:
            timeline.span(name, phase, base + round(start * 1000), base + round(end[0] * 1000))
    timeline.close()
    return str(path)


def _exchange(name, handed, start, end, moves=_MOVES):
    """Return the events of one tensor: handed over, waiting until ``start``, moving to ``end``."""
    asked = (handed + start) / 2
    events = [
        (name, tl.ENQUEUE, handed),
        (name, tl.NEGOTIATE, handed, asked),
        (name, tl.WAIT_FOR_OTHER_RANKS, asked, start),
    ]
    part = (end - start) / len(moves)
    for k, phase in enumerate(moves):
        events.append((name, phase, start + k * part, start + (k + 1) * part))
    return events


def _step(handed, works):
    """Return the events of one step: ``handed`` and ``works`` map tensor suffixes to times."""
    events = []
    for suffix, at in handed.items():
        events += _exchange(f"{SITE}.{suffix}", at, *works[suffix])
    return events


# Step 1, fully hidden: the last tensor handed over (at 1000) is empty and done at once.
STEP_1 = _step(
    {"2": 0, "1": 100, "manifest": 300, "0": 1000},
    {"2": (50, 300), "1": (400, 600), "manifest": (400, 600), "0": (1000, 1000)},
)
# Step 2: 250 of its 650 us of communication lie before the last hand-over, at 5400.
STEP_2 = _step(
    {"2": 5000, "1": 5100, "manifest": 5150, "0": 5400},
    {"2": (5050, 5300), "1": (5500, 5900), "manifest": (5500, 5900), "0": (5500, 5900)},
)
# Step 3: two fused groups, 100 of 400 us hidden, exposed from 9200 to 9500.
STEP_3 = _step(
    {"2": 9000, "1": 9050, "manifest": 9100, "0": 9200},
    {"2": (9100, 9300), "1": (9100, 9300), "manifest": (9300, 9500), "0": (9300, 9500)},
)
NOISE = [
    # Spans of a tensor handed over before the timeline started: no step's.
    (f"{SITE}.2", tl.WAIT_FOR_OTHER_RANKS, -500, -400),
    (f"{SITE}.2", tl.ALLGATHER, -400, -300),
    # The variables' broadcast at the start: a site, but not a training step.
    *_exchange("broadcast_variables.manifest", -3000, -2900, -2800),
    *_exchange("broadcast_variables.0", -3000, -2800, -2700, moves=["BROADCAST"]),
    # A script's own allreduce between steps.
    *_exchange("MetricAverageCallback.values", 6000, 6100, 8000),
    # A step the timeline stopped in: left out.
    (f"{SITE}.manifest", tl.ENQUEUE, 12000),
    (f"{SITE}.2", tl.ENQUEUE, 12000),
    (f"{SITE}.2", tl.NEGOTIATE, 12000, 12010),
]


@pytest.fixture
def three_steps(tmp_path):
    return _write(tmp_path / "tl.json", STEP_1 + NOISE + STEP_3 + STEP_2)


def test_each_steps_figures_match_the_known_times(three_steps):
    found = steps.split(trace.load(three_steps))
    assert found.incomplete == 1
    assert [s.number for s in found.steps] == [1, 2, 3]
    assert {s.site for s in found.steps} == {SITE}
    want = {
        # backprop, communication, hidden, exposed (us), groups in hand-over order
        1: (1000, 450, 450, 0, [1, 2, 2, 3]),
        2: (400, 650, 250, 500, [1, 2, 2, 2]),
        3: (200, 400, 100, 300, [1, 1, 2, 2]),
    }
    for step in found.steps:
        backprop, communication, hidden, exposed, groups = want[step.number]
        assert step.backprop == pytest.approx(backprop, abs=0.01)
        assert step.communication == pytest.approx(communication, abs=0.01)
        assert step.hidden == pytest.approx(hidden, abs=0.01)
        assert step.exposed == pytest.approx(exposed, abs=0.01)
        assert step.hidden_fraction == pytest.approx(hidden / communication, abs=1e-4)
        assert step.groups == groups
        assert [s.name for s in step.submissions] == [
            f"{SITE}.{suffix}" for suffix in ("2", "1", "manifest", "0")
        ]
    assert found.steps[0].hidden_fraction == pytest.approx(1.0)
    assert found.representative().number == 2  # durations 1000, 900 and 500 us


def test_the_table_shows_every_step_and_the_median(three_steps, capsys):
    assert main([three_steps]) == 0
    out = capsys.readouterr().out
    heading, table, legend, chosen = out.split("\n\n")
    assert "1 step(s) cut off" in heading
    assert "hidden: share of comm before the last hand-over" in legend
    rows = {line.split()[0]: line.split()[1:] for line in table.splitlines()}
    assert rows["1"] == ["1.00", "0.45", "100%", "0.00", "4", "3"]
    assert rows["2"] == ["0.40", "0.65", "38%", "0.50", "4", "2"]
    assert rows["3"] == ["0.20", "0.40", "25%", "0.30", "4", "2"]
    assert rows["median"] == ["0.40", "0.45", "38%", "0.30"]
    assert chosen.startswith("step 2 (DistributedOptimizer)")  # the median step's tensors
    tensors = {line.split()[0]: line.split()[1:] for line in chosen.splitlines()[2:]}
    assert list(tensors) == ["2", "1", "manifest", "0"]
    assert tensors["manifest"] == ["0.15", "0.35", "0.40", "0.90", "2"]


def test_json_holds_every_step_and_the_chosen_one(three_steps, capsys):
    assert main([three_steps, "--json", "--step", "3"]) == 0
    values = json.loads(capsys.readouterr().out)
    assert values["chosen_step"] == 3
    assert values["incomplete_steps"] == 1
    assert [s["step"] for s in values["steps"]] == [1, 2, 3]
    step = values["steps"][2]
    assert step["exposed_ms"] == pytest.approx(0.3, abs=1e-5)
    assert step["hidden_fraction"] == pytest.approx(0.25, abs=1e-4)
    assert [t["group"] for t in step["tensors"]] == [1, 1, 2, 2]
    assert step["tensors"][0]["work_end_ms"] - step["tensors"][0]["handed_ms"] == pytest.approx(
        0.3, abs=1e-5
    )
    assert values["median"]["communication_ms"] == pytest.approx(0.45, abs=1e-5)


def test_sparse_gradients_and_a_second_site_split_into_steps(tmp_path):
    tape, second = "DistributedGradientTape", "DistributedGradientTape.1"
    events = []
    for start in (0, 1000):
        events += _exchange(f"{tape}.0.values", start, start + 100, start + 200, ["ALLGATHER"])
        events += _exchange(f"{tape}.0.indices", start, start + 200, start + 300, ["ALLGATHER"])
        events += _exchange(f"{tape}.1", start + 10, start + 100, start + 200)
        events += _exchange(f"{tape}.manifest", start + 10, start + 100, start + 200)
        events += _exchange(f"{second}.0", start + 500, start + 600, start + 700)
        events += _exchange(f"{second}.manifest", start + 500, start + 600, start + 700)
    found = steps.split(trace.load(_write(tmp_path / "tl.json", events)))
    assert [(s.site, len(s.submissions)) for s in found.steps] == [
        (tape, 4),
        (second, 2),
        (tape, 4),
        (second, 2),
    ]
    assert found.steps[2].communication == pytest.approx(200, abs=0.01)


def test_the_png_is_written_and_shows_the_lanes(three_steps, tmp_path, capsys):
    from ringtrain.timeline import picture

    found = steps.split(trace.load(three_steps))
    figure = picture.figure(found.step(2))
    (axes,) = figure.axes
    labels = [label.get_text() for label in axes.get_yticklabels()]
    assert labels == ["backprop", "2", "1", "manifest", "0"]
    assert "exposed 0.50 ms" in [text.get_text().strip() for text in axes.texts]

    png = tmp_path / "step.png"
    assert main([three_steps, "--step", "3", "--png", str(png)]) == 0
    assert "step 3 drawn into" in capsys.readouterr().err
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (900, round(100 * (1.4 + 0.32 * 5)))
    assert 5_000 < len(data) < 300_000


def test_png_without_matplotlib_says_how_to_install_it(three_steps, tmp_path, monkeypatch, capsys):
    for module in ("matplotlib", "matplotlib.figure", "matplotlib.patches"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ModuleNotFoundError
    monkeypatch.delitem(sys.modules, "ringtrain.timeline.picture", raising=False)
    png = tmp_path / "step.png"
    with pytest.raises(SystemExit) as exited:
        main([three_steps, "--png", str(png)])
    assert exited.value.code == 2
    assert "pip install 'ringtrain[plot]'" in capsys.readouterr().err
    assert not png.exists()


def _error(capsys, *argv):
    """Return the message of the command line on ``argv``, which must exit with status 2."""
    with pytest.raises(SystemExit) as exited:
        main(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json {", "not a JSON timeline"),
        ('{"a": 1}', "not a timeline: expected a JSON array"),
        ('[{"x": 1}]', "not a ringtrain timeline"),
        ('[{"ph": "i", "name": "ENQUEUE", "ts": 1, "pid": 0, "tid": 7}]', "no thread_name"),
        (b"\xff\xfe[", "not a JSON timeline"),
    ],
)
def test_a_file_in_another_format_is_named_in_the_error(tmp_path, capsys, content, message):
    path = tmp_path / "odd.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    err = _error(capsys, str(path))
    assert f"{path}: " in err
    assert message in err


def test_a_missing_file_is_named_in_the_error(tmp_path):
    path = tmp_path / "nowhere.json"
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "ringtrain.timeline", str(path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert done.returncode == 2
    assert f"{path}: cannot read it: No such file or directory" in done.stderr


def test_an_empty_trace_says_so(tmp_path, capsys):
    path = _write(tmp_path / "empty.json", [])
    assert "the timeline holds no events" in _error(capsys, path)


def test_a_trace_without_steps_says_what_a_step_is(tmp_path, capsys):
    path = _write(tmp_path / "nosteps.json", NOISE[2:])
    err = _error(capsys, path)
    assert "no training steps (only steps whose exchange it does not hold" in err
    assert "SITE.manifest" in err
    path = _write(tmp_path / "none.json", NOISE[2:-3])
    assert "no training steps (none)" in _error(capsys, path)


def test_a_step_out_of_range_and_several_ranks_are_refused(three_steps, tmp_path, capsys):
    assert "there is no step 4: its steps are 1 to 3" in _error(capsys, three_steps, "--step", "4")
    both = tmp_path / "both.json"
    events = json.loads(open(three_steps).read())
    events.append(dict(events[-1], pid=1))
    both.write_text(json.dumps(events))
    assert "holds the events of ranks [0, 1]" in _error(capsys, str(both))
