"""The one reader of ringtrain's settings: ``RINGTRAIN_*`` variables and ``init()`` keywords."""

import dataclasses
import math
import os
import warnings

from ringtrain.contract import ELASTIC_DIR, ELASTIC_GENERATION, PREFIX

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Tunables of one ringtrain process; read once at ``init()``."""

    cycle_time_ms: float = 1.0
    fusion_threshold: int = 64 * 1024 * 1024
    timeline: str | None = None
    stall_check_seconds: float = 60.0
    stall_shutdown_seconds: float | None = None
    # Unnamed calls that every rank waits for, none made by all, fail after this many seconds
    # without a submission (engine.negotiation's drift check); 0 turns it off. Long enough for
    # a thread that makes its unnamed calls alongside another's; far below the stall warning.
    unnamed_drift_seconds: float = 5.0
    # A collective whose peer makes no progress for this many seconds fails on every rank
    # that can still act, and the job ends; 0 turns it off. Once every rank has started a
    # collective, its peers move a chunk every few milliseconds (seconds over a slow link);
    # five minutes leaves room for a swapped-out or oversubscribed rank, and ends a hang
    # long before a person would notice it.
    collective_timeout: float = 300.0
    cache_capacity: int = 1024
    ring_chunk_bytes: int = 1024 * 1024
    # Where a job spans hosts, its first calls of 8 MiB and more try 128 KiB chunks across
    # hosts beside this chunk, and every rank keeps the faster (transport.link_chunk). At
    # 1 Gbit/s, 2 hosts x 2 ranks, that took 16 MiB from 166 ms to 154; off: never tried.
    ring_chunk_trial: bool = True
    # The message ring posts receives ahead until they cover this many bytes (at least 4
    # chunks). MPI's TCP transport starts sending a large message only once the peer's
    # receive is posted and its answer has crossed back, behind the bytes queued in the other
    # direction, and that queue grows as a transfer goes on: between two hosts at 1 Gbit/s,
    # streaming 64 MiB each way in 1 MiB messages moved 0.62 Gbit/s with 16 MiB posted ahead
    # and 0.955 with 64 MiB (docs/benchmarks.md). It is also the scratch each rank keeps, and
    # no more than a call's segment.
    ring_window_bytes: int = 64 * 1024 * 1024
    # Calls of up to this many bytes run through shared memory when every rank is on one
    # host; 0 turns it off. Measured (docs/benchmarks.md): it beats MPI messages up to 12 MiB
    # here; 4 MiB keeps the file (2 regions of this size per rank) within a 64 MiB /dev/shm
    # up to 7 ranks per host.
    shared_memory_bytes: int = 4 * 1024 * 1024
    # Of the same file, this many bytes hold allreduce results that the host's ranks read in
    # place (results that callers asked for read-only, as ringtrain.tensorflow does); 0 turns
    # it off. 16 MiB holds a step's gradients of the benchmark's MLP (11.6 MB) and keeps the
    # file within a 64 MiB /dev/shm up to 5 ranks per host.
    shared_result_bytes: int = 16 * 1024 * 1024
    hierarchical_allreduce: bool | None = None  # None: on when the job spans several hosts
    # Reductions of GPU arrays hand their device buffers to MPI itself, which must then be
    # CUDA-aware; off, they are staged through host memory. None: ask Open MPI at init()
    # (``transport.device_mpi``); every rank must say yes.
    cuda_aware_mpi: bool | None = None
    # ringtrain.tensorflow's ops hand tensors to the engine through DLPack (tf.py_function),
    # so that GPU tensors stay on the GPU; off, through tf.numpy_function, which copies them
    # to the host. None: on where TensorFlow sees a GPU. On CPU tensors it cost the MLP's
    # training 11-14% (docs/tensorflow.md, GPU tensors). Read when a step is traced.
    tf_dlpack: bool | None = None
    # ringtrain.tensorflow hands a step's gradients to the engine in buckets: consecutive
    # gradients smaller than this, in backprop order, share one TensorFlow op until they
    # hold this many bytes; a larger one has an op of its own; 0 gives every gradient its
    # own op. Each op costs TensorFlow's threads, and most of a model's gradients are
    # small (docs/benchmarks.md, bucket bytes).
    bucket_bytes: int = 256 * 1024
    # The ranks of a host that the launcher left the same CPUs divide its cores among
    # themselves at init() (ringtrain.affinity). Measured (docs/benchmarks.md): at -np 2 on
    # 2 cores the MLP's model.fit ran 5% faster at one inter-op thread, 17% at TensorFlow's
    # default; its custom step 2% and 5%.
    bind_cores: bool = True
    # Rank 0 tries settings during the first steps and every rank switches to the best
    # (``ringtrain.engine.tuning``); a setting the user gave is left alone.
    autotune: bool = False
    autotune_log: str | None = None  # a CSV of every sample's settings and score
    autotune_cache: str | None = None  # a file that remembers the best settings per job
    autotune_warmup_samples: int = 1  # samples' worth of steps run untimed before tuning
    autotune_steps_per_sample: int = 8
    autotune_samples: int = 16  # settings searched, the defaults first (a confirmation follows)
    # The fields above that the user gave (environment or init() keywords): autotune leaves
    # these alone. Not a setting of its own.
    user_set: frozenset = frozenset()


def _parse_bool(text):
    low = text.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise ValueError("expected one of 1/0, true/false, yes/no, on/off")


def _parse_number(kind, minimum, *, strict_min=False, optional=False):
    noun = "an integer" if kind is int else "a number"

    def parse(text):
        if optional and (text is None or str(text).strip() == ""):
            return None
        if isinstance(text, bool):
            raise ValueError(f"expected {noun}, not a bool")
        try:
            value = kind(text.strip() if isinstance(text, str) else text)
        except (TypeError, ValueError):
            raise ValueError(f"expected {noun}") from None
        if kind is float and not math.isfinite(value):
            raise ValueError("expected a finite number")
        if kind is int and isinstance(text, float) and text != value:
            raise ValueError("expected a whole number")
        if value < minimum or (strict_min and value == minimum):
            bound = ">" if strict_min else ">="
            raise ValueError(f"expected a number {bound} {minimum}")
        return value

    return parse


def _parse_path(text):
    text = str(text).strip()
    return text or None


# field name -> (environment variable without the prefix, parser)
_FIELDS = {
    "cycle_time_ms": ("CYCLE_TIME", _parse_number(float, 0.0, strict_min=True)),
    "fusion_threshold": ("FUSION_THRESHOLD", _parse_number(int, 0)),
    "timeline": ("TIMELINE", _parse_path),
    "stall_check_seconds": ("STALL_CHECK_SECONDS", _parse_number(float, 0.0)),
    "stall_shutdown_seconds": (
        "STALL_SHUTDOWN_SECONDS",
        _parse_number(float, 0.0, strict_min=True, optional=True),
    ),
    "unnamed_drift_seconds": ("UNNAMED_DRIFT_SECONDS", _parse_number(float, 0.0)),
    "collective_timeout": ("COLLECTIVE_TIMEOUT", _parse_number(float, 0.0)),
    "cache_capacity": ("CACHE_CAPACITY", _parse_number(int, 0)),
    "ring_chunk_bytes": ("RING_CHUNK_BYTES", _parse_number(int, 1)),
    "ring_chunk_trial": ("RING_CHUNK_TRIAL", _parse_bool),
    "ring_window_bytes": ("RING_WINDOW_BYTES", _parse_number(int, 0)),
    "shared_memory_bytes": ("SHARED_MEMORY_BYTES", _parse_number(int, 0)),
    "shared_result_bytes": ("SHARED_RESULT_BYTES", _parse_number(int, 0)),
    "hierarchical_allreduce": ("HIERARCHICAL_ALLREDUCE", _parse_bool),
    "cuda_aware_mpi": ("CUDA_AWARE_MPI", _parse_bool),
    "tf_dlpack": ("TF_DLPACK", _parse_bool),
    "bucket_bytes": ("BUCKET_BYTES", _parse_number(int, 0)),
    "bind_cores": ("BIND_CORES", _parse_bool),
    "autotune": ("AUTOTUNE", _parse_bool),
    "autotune_log": ("AUTOTUNE_LOG", _parse_path),
    "autotune_cache": ("AUTOTUNE_CACHE", _parse_path),
    "autotune_warmup_samples": ("AUTOTUNE_WARMUP_SAMPLES", _parse_number(int, 0)),
    "autotune_steps_per_sample": ("AUTOTUNE_STEPS_PER_SAMPLE", _parse_number(int, 1)),
    "autotune_samples": ("AUTOTUNE_SAMPLES", _parse_number(int, 1)),
}

# Horovod's variables that are read where the ``RINGTRAIN_*`` one is not set.
HOROVOD_ALIASES = {
    "HOROVOD_AUTOTUNE": "autotune",
    "HOROVOD_AUTOTUNE_LOG": "autotune_log",
    "HOROVOD_AUTOTUNE_WARMUP_SAMPLES": "autotune_warmup_samples",
    "HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE": "autotune_steps_per_sample",
    "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "autotune_samples",
}


_NONE_ALLOWED = frozenset(f.name for f in dataclasses.fields(Settings) if f.default is None)


@dataclasses.dataclass(frozen=True)
class ElasticLaunch:
    """Where an elastic job's commits go, and how many times the job was relaunched before.

    ``ringtrain-run``'s elastic mode gives each rank both (``contract.ELASTIC_DIR``,
    ``contract.ELASTIC_GENERATION``): they are not settings of their own. ``directory`` is
    None outside that mode: nothing is written then.
    """

    directory: str | None = None
    generation: int = 0


def elastic_launch(environ=None) -> ElasticLaunch:
    """Read the elastic launch from ``environ`` (default ``os.environ``).

    A bad value raises ValueError naming the variable, the value and what was expected.
    """
    environ = os.environ if environ is None else environ
    values = {}
    if ELASTIC_DIR in environ:
        values["directory"] = _apply(_parse_path, environ[ELASTIC_DIR], ELASTIC_DIR)
    if ELASTIC_GENERATION in environ:
        parse = _parse_number(int, 0)
        values["generation"] = _apply(parse, environ[ELASTIC_GENERATION], ELASTIC_GENERATION)
    return ElasticLaunch(**values)


def env_name(field: str) -> str:
    """Return the environment variable that sets ``field``."""
    return PREFIX + _FIELDS[field][0]


def read(environ=None, **overrides) -> Settings:
    """Build Settings from ``environ`` (default ``os.environ``), then keyword overrides.

    A bad value raises ValueError naming the variable or keyword, the value and what was expected.
    """
    environ = os.environ if environ is None else environ
    known = {PREFIX + var for var, _ in _FIELDS.values()} | {ELASTIC_DIR, ELASTIC_GENERATION}
    unknown = sorted(k for k in environ if k.startswith(PREFIX) and k not in known)
    for name in unknown:
        warnings.warn(
            f"ignoring unknown setting {name}; known settings are {', '.join(sorted(known))}",
            stacklevel=2,
        )
    values = {}
    for field, (var, parse) in _FIELDS.items():
        if PREFIX + var in environ:
            values[field] = _apply(parse, environ[PREFIX + var], PREFIX + var)
    for alias, field in HOROVOD_ALIASES.items():
        if alias in environ and field not in values:
            values[field] = _apply(_FIELDS[field][1], environ[alias], alias)
    for field, value in overrides.items():
        if field not in _FIELDS:
            raise TypeError(
                f"init() got an unknown setting {field!r}; known settings are "
                f"{', '.join(sorted(_FIELDS))}"
            )
        # None leaves a setting as it was, except where None is itself a value ("off").
        if value is not None or field in _NONE_ALLOWED:
            parse = _FIELDS[field][1]
            values[field] = value if value is None else _apply(parse, value, field)
    return Settings(**values, user_set=frozenset(values))


def _apply(parse, raw, label):
    if isinstance(raw, bool) and parse is _parse_bool:
        return raw
    try:
        return parse(raw)
    except ValueError as err:
        raise ValueError(f"bad value {raw!r} for {label}: {err}") from None
