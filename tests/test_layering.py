"""The package's layers: imports run downwards only, and each floor keeps to its job.

Read from the source with ``ast``, so that a new import that breaks a rule fails here before
it can tangle the engine again.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "ringtrain"

# Units (top-level modules and packages of ringtrain), lowest layer first. A unit may import
# from its own layer and those below it, never from a layer above.
LAYERS = [
    {"contract", "errors", "ops", "dtypes", "buffers", "compression"},
    {"settings", "topology", "affinity", "kernels", "dlpack", "tf_allocator", "mpi_tuning"},
    {"transport"},
    {"engine"},
    {"process_sets", "runtime", "api", "interop", "call_site", "capabilities", "elastic", "guard"},
    {"timeline"},
    {"exchange"},  # what the framework bindings hand their tensors over through
    {"tensorflow", "keras", "__init__"},
    {"bench"},
]
LAUNCHER = "runner"  # what ringtrain-run runs: it shares only the contract and the settings
# Modules that start mpirun themselves, outside any rank, and so find it as the launcher does.
MPIRUN_STARTERS = {Path("bench/compare.py"): "ringtrain.runner.locate.find_mpirun"}
_LAYER = {unit: level for level, units in enumerate(LAYERS) for unit in units}
# Buffer calls of mpi4py that move tensor data; the engine leaves them to its transport.
_MPI_DATA_CALLS = {
    "Send", "Recv", "Isend", "Irecv", "Sendrecv", "Bcast", "Reduce", "Allreduce",
    "Allgather", "Allgatherv", "Alltoall", "Alltoallv", "Reduce_scatter", "Scatter", "Gather",
}  # fmt: skip


def _unit(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return "__init__" if parts == ("__init__.py",) else parts[0].removesuffix(".py")


def _imports(path: Path) -> set[str]:
    """Return the modules ``path`` imports: ``a.b`` for ``import a.b`` and ``from a import b``."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _ringtrain_units(path: Path) -> set[str]:
    """Return the units of ringtrain that ``path`` imports (``ringtrain`` alone: ``__init__``)."""
    units = set()
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "ringtrain":
            units.add(parts[1] if len(parts) > 1 else "__init__")
    return units


def _modules():
    return sorted(PACKAGE.rglob("*.py"))


def test_every_unit_has_a_layer():
    units = {_unit(path) for path in _modules()} - {LAUNCHER}
    assert units - set(_LAYER) == set(), "add the new unit to LAYERS"


def test_no_module_imports_from_a_layer_above_it():
    upward = {}
    for path in _modules():
        unit = _unit(path)
        if unit == LAUNCHER:
            continue
        above = {u for u in _ringtrain_units(path) if u != LAUNCHER and _LAYER[u] > _LAYER[unit]}
        if above:
            upward[str(path.relative_to(PACKAGE))] = sorted(above)
    assert upward == {}


def test_the_launcher_and_the_ranks_share_only_the_contract_and_the_settings():
    strays = {}
    for path in _modules():
        units = _ringtrain_units(path)
        if _unit(path) == LAUNCHER:
            wrong = units - {LAUNCHER, "contract", "settings"}
        elif path.name == "contract.py":
            wrong = units
        else:
            from_launcher = {n for n in _imports(path) if n.startswith(f"ringtrain.{LAUNCHER}")}
            allowed = {MPIRUN_STARTERS.get(path.relative_to(PACKAGE))}
            wrong = units & {LAUNCHER} if from_launcher - allowed else set()
        if wrong:
            strays[str(path.relative_to(PACKAGE))] = sorted(wrong)
    assert strays == {}


def test_the_engine_transports_and_kernels_import_no_tensorflow():
    below_the_binding = [p for p in _modules() if _LAYER.get(_unit(p), 99) <= _LAYER["engine"]]
    assert any(_unit(p) == "engine" for p in below_the_binding)
    framework = {}
    for path in below_the_binding:
        found = {n.split(".")[0] for n in _imports(path)} & {"tensorflow", "keras"}
        if found:
            framework[str(path.relative_to(PACKAGE))] = sorted(found)
    assert framework == {}


def test_the_engine_makes_no_mpi_calls_of_its_own():
    importers = [p.name for p in (PACKAGE / "engine").rglob("*.py") if "mpi4py" in {
        n.split(".")[0] for n in _imports(p)}]  # fmt: skip
    assert importers == [], "the engine reaches MPI through its transport and control channel"
    calls = {}
    for path in (PACKAGE / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr in _MPI_DATA_CALLS:
                    calls.setdefault(path.name, []).append(f"{node.func.attr} (line {node.lineno})")
    assert calls == {}, "the engine moves data through its transport only"


def test_the_check_sees_a_data_call_and_an_upward_import(tmp_path):
    """The scans above find what they look for (so that an empty result means something)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from ringtrain.tensorflow import x\nimport ringtrain\ncomm.Allgatherv(a, b)\n"
    )
    assert _ringtrain_units(probe) == {"tensorflow", "__init__"}
    tree = ast.parse(probe.read_text())
    attrs = {n.func.attr for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert attrs & _MPI_DATA_CALLS == {"Allgatherv"}
