"""The algorithm registry (dmatmul.algorithms): complete, consistent with each
backend's kernels, and open: an algorithm registered at run time (one module's
worth of code plus one JAX kernel) is planned and run."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np
import pytest

import dmatmul as dm
from dmatmul import _cost, _plan, algorithms
from dmatmul.algorithms.allgather import AllGather


def test_every_contract_algorithm_has_a_module_and_kernels():
    assert list(algorithms.ALGORITHMS) == list(dm.ALGORITHMS)  # the contract's order breaks cost ties
    for name, alg in algorithms.ALGORITHMS.items():
        assert alg.name == name
        assert importlib.import_module(f"dmatmul.algorithms.{name}").ALGORITHM is alg
        assert alg.kernels and all(kern.algorithm == name for kern in alg.kernels)
        # "G": the product's 2-D grid (SUMMA), or the algorithm's own layouts that it re-lays any operand into
        assert all(kern.a == kern.b == kern.d == "G" for kern in alg.kernels) == (alg.grid or alg.relays)
    assert set(_plan.KERNELS) == {kern for alg in algorithms.ALGORITHMS.values() for kern in alg.kernels}


def test_every_algorithm_has_a_jax_kernel():
    pytest.importorskip("jax")
    _kernels = importlib.import_module("dmatmul.backends.jax._kernels")
    assert set(_kernels.BODIES) == set(algorithms.ALGORITHMS)


def test_nvmath_paths_are_registered_kernels():
    # cuBLASMp's per-kernel table: each of its kernels the registry's, and each 1-D algorithm there (a grid
    # one goes to cuBLASMp's SUMMA path instead; 2.5-D SUMMA, re-laid into layers, has no nvmath kernel yet)
    _types = importlib.import_module("dmatmul.backends.nvmath._translate._types")
    registered = set(_plan.KERNELS)
    assert set(_types.PATHS) <= registered
    assert {kern.algorithm for kern in _types.PATHS} == {
        name for name, alg in algorithms.ALGORITHMS.items() if not alg.grid and not alg.relays}


def test_register_refuses_a_taken_name_or_a_foreign_kernel():
    with pytest.raises(ValueError, match="registered already"):
        algorithms.register(AllGather())

    class Mislabelled(AllGather):
        name = "mislabelled"

    with pytest.raises(ValueError, match="carry its name"):
        algorithms.register(Mislabelled())
    assert "mislabelled" not in algorithms.ALGORITHMS


class Toy(AllGather):
    """AllGather+GEMM under another name: what a new algorithm's module holds."""

    name = "toy"
    summary = "a copy of allgather"
    kernels = tuple(dataclasses.replace(kern, algorithm="toy") for kern in AllGather.kernels)


@pytest.fixture
def toy():
    """``toy`` registered, with the JAX backend's kernel for it; both removed after."""
    pytest.importorskip("jax")
    _kernels = importlib.import_module("dmatmul.backends.jax._kernels")
    algorithms.register(Toy())
    _kernels.BODIES["toy"] = _kernels.BODIES["allgather"]
    try:
        yield
    finally:
        algorithms.unregister("toy")
        del _kernels.BODIES["toy"]


def test_a_registered_algorithm_is_planned_and_run(toy):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((24, 16)).astype("float32"), rng.standard_normal((16, 20)).astype("float32")
    with dm.Matmul(a, b, distribution=(dm.Slab.X, dm.Slab.X, dm.Slab.X), algorithm="toy", backend="jax",
                   devices=4) as mm:
        got = mm.execute()
        assert mm.algorithm == "toy"
        assert "toy: a copy of allgather" in mm.explain()  # the registry's summary names it
    np.testing.assert_allclose(got, a @ b, rtol=1e-5, atol=1e-5)
    # it is a candidate for "auto" too, planned beside the algorithm it copies (which wins the tie)
    pr = _plan.Problem1D(64, 64, 64, 4, 4, 4)
    found = _plan.plans(pr, {"a": "M", "b": "K", "d": "M"}, _cost.model_for("cpu"))
    names = [pl.algorithm for pl in found]
    assert "toy" in names and names.index("allgather") < names.index("toy")
