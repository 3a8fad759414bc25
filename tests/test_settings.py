"""The settings reader: defaults, environment, keywords and clear errors."""

import pytest

from ringtrain import settings


def test_defaults():
    s = settings.read({})
    assert s.cycle_time_ms == 1.0 and s.fusion_threshold == 64 * 1024 * 1024
    assert s.stall_check_seconds == 60.0 and s.stall_shutdown_seconds is None
    assert s.shared_memory_bytes == 4 * 1024 * 1024
    assert s.ring_window_bytes == 64 * 1024 * 1024
    assert s.shared_result_bytes == 16 * 1024 * 1024
    assert s.bucket_bytes == 256 * 1024
    assert s.bind_cores is True


def test_environment_then_keywords_win():
    env = {"RINGTRAIN_CYCLE_TIME": "2.5", "RINGTRAIN_FUSION_THRESHOLD": "1024"}
    s = settings.read(env, fusion_threshold=0)
    assert s.cycle_time_ms == 2.5 and s.fusion_threshold == 0
    assert settings.read({"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "Yes"}).hierarchical_allreduce
    assert settings.read({"RINGTRAIN_BIND_CORES": "off"}).bind_cores is False
    assert settings.read({}).cuda_aware_mpi is None  # ask MPI
    assert settings.read({}).tf_dlpack is None  # where TensorFlow sees a GPU
    assert settings.read({"RINGTRAIN_TF_DLPACK": "yes"}).tf_dlpack is True
    assert settings.read({"RINGTRAIN_TF_DLPACK": "0"}).tf_dlpack is False
    assert settings.read({"RINGTRAIN_CUDA_AWARE_MPI": "1"}).cuda_aware_mpi is True
    assert settings.read({"RINGTRAIN_CUDA_AWARE_MPI": "off"}).cuda_aware_mpi is False
    assert settings.read({"RINGTRAIN_BIND_CORES": "0"}, bind_cores=True).bind_cores is True


@pytest.mark.parametrize(
    ("env", "message"),
    [
        (
            {"RINGTRAIN_CYCLE_TIME": "0"},
            "bad value '0' for RINGTRAIN_CYCLE_TIME: expected a number > 0",
        ),
        ({"RINGTRAIN_CYCLE_TIME": "fast"}, "RINGTRAIN_CYCLE_TIME: expected a number"),
        ({"RINGTRAIN_FUSION_THRESHOLD": "1.5"}, "RINGTRAIN_FUSION_THRESHOLD: expected an integer"),
        ({"RINGTRAIN_FUSION_THRESHOLD": "-1"}, "expected a number >= 0"),
        ({"RINGTRAIN_STALL_CHECK_SECONDS": "nan"}, "expected a finite number"),
        ({"RINGTRAIN_HIERARCHICAL_ALLREDUCE": "maybe"}, "expected one of 1/0, true/false"),
        ({"RINGTRAIN_CUDA_AWARE_MPI": "cuda"}, "'cuda' for RINGTRAIN_CUDA_AWARE_MPI: expected one"),
        ({"RINGTRAIN_SHARED_MEMORY_BYTES": "-5"}, "SHARED_MEMORY_BYTES: expected a number >= 0"),
        ({"RINGTRAIN_SHARED_RESULT_BYTES": "lots"}, "SHARED_RESULT_BYTES: expected an integer"),
        ({"RINGTRAIN_BUCKET_BYTES": "-1"}, "BUCKET_BYTES: expected a number >= 0"),
        ({"RINGTRAIN_RING_WINDOW_BYTES": "-1"}, "RING_WINDOW_BYTES: expected a number >= 0"),
        ({"RINGTRAIN_BIND_CORES": "2"}, "bad value '2' for RINGTRAIN_BIND_CORES: expected one of"),
    ],
)
def test_bad_environment_values_name_variable_and_value(env, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        settings.read(env)


def test_bad_keyword_and_unknown_keyword():
    with pytest.raises(ValueError, match="bad value -1 for cycle_time_ms"):
        settings.read({}, cycle_time_ms=-1)
    with pytest.raises(TypeError, match="unknown setting 'cycle'"):
        settings.read({}, cycle=1)


def test_unknown_variable_warns():
    with pytest.warns(UserWarning, match="ignoring unknown setting RINGTRAIN_CYCLETIME"):
        settings.read({"RINGTRAIN_CYCLETIME": "1"})


def test_env_name():
    assert settings.env_name("stall_shutdown_seconds") == "RINGTRAIN_STALL_SHUTDOWN_SECONDS"
