"""``mpi_tuning`` defaults Open MPI's TCP eager limit to hold a ring chunk, unless told not to."""

import sys

from ringtrain import mpi_tuning
from ringtrain.mpi_tuning import EAGER_LIMIT_VARIABLE, OPEN_MPI_EAGER_LIMIT


def test_the_limit_holds_a_chunk_and_its_headers():
    assert mpi_tuning.tcp_eager_limit(1 << 20) == (1 << 20) + 1024
    assert mpi_tuning.tcp_eager_limit(1) == OPEN_MPI_EAGER_LIMIT  # never below Open MPI's


def test_set_before_mpi_starts(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    environ = {}
    assert mpi_tuning.apply(4096, environ)
    assert environ == {EAGER_LIMIT_VARIABLE: str(OPEN_MPI_EAGER_LIMIT)}


def test_a_users_value_wins(monkeypatch):
    monkeypatch.delitem(sys.modules, "mpi4py.MPI", raising=False)
    environ = {EAGER_LIMIT_VARIABLE: "4096"}
    assert not mpi_tuning.apply(1 << 20, environ)
    assert environ == {EAGER_LIMIT_VARIABLE: "4096"}


def test_nothing_once_mpi_has_started(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", object())
    environ = {}
    assert not mpi_tuning.apply(1 << 20, environ)
    assert environ == {}
