"""Turn ringtrain-run's tuning options into the ``RINGTRAIN_*`` variables that every rank gets."""

from ringtrain import contract, settings

# option (as a keyword of settings_env) -> (Settings field, the variable's text for a value)
_OPTIONS = {
    "fusion_threshold_mb": ("fusion_threshold", lambda mb: str(round(mb * 1024 * 1024))),
    "cycle_time_ms": ("cycle_time_ms", str),
    "timeline_filename": ("timeline", str),
    "stall_check_warning_time_seconds": ("stall_check_seconds", str),
    "stall_check_shutdown_time_seconds": ("stall_shutdown_seconds", str),
    "hierarchical_allreduce": ("hierarchical_allreduce", lambda on: "1"),
    "autotune": ("autotune", lambda on: "1"),
    "autotune_log_file": ("autotune_log", str),
}


def settings_env(environ, **options) -> dict[str, str]:
    """Return the ``RINGTRAIN_*`` variables to export: those in ``environ``, then the options.

    An option that is None or False is left out, so it keeps the value from ``environ``.
    Raise ValueError naming the variable when a value is not a valid setting.
    """
    env = {name: value for name, value in environ.items() if name.startswith(contract.PREFIX)}
    for option, value in options.items():
        field, to_text = _OPTIONS[option]
        if value is not None and value is not False:
            env[settings.env_name(field)] = to_text(value)
    settings.read(env)
    return env
