"""Generated bad input: one valid call, then one thing corrupted at a time.

Each property draws a VALID call (checked first: it runs and matches numpy),
then corrupts exactly one argument in one of many ways and requires of each
corrupted call (docs/guide.md "Errors", CONTRACT section 6):

* a ``TypeError`` or ``ValueError`` (``dm.DistributionError`` is one), never
  an internal error (AttributeError, IndexError, KeyError, AssertionError,
  jax/XLA errors, numpy's own messages);
* whose message names the argument and what was given (its value, type,
  shape or dtype) -- words, not exact strings;
* raised before any heavy work (no jitted function of the JAX backend is
  built or run);
* the caller's arrays bit-identical afterwards, and a following valid call
  (the same one, and for a plan its next ``execute()``) still right: no
  poisoned cache or plan.

Properties: ``dm.matmul`` / ``dm.Matmul`` / ``Matmul.reset_operands`` (every
distribution kind and triple, transposes, alpha/beta/c, epilog/bias,
backend, algorithm, devices, precision; numpy and jax.Array operands),
``dm.split`` / ``dm.join``, the distribution constructors, and
``dmatmul.jax.allgather_matmul`` / ``matmul_reduce_scatter`` inside
``jax.shard_map``. CI runs a bounded, derandomized number of examples
(about 20 s in all); ``DMATMUL_LONG=1`` runs many more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
from typing import Any, Callable
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

import dmatmul as dm  # noqa: E402
import dmatmul.jax as dmj  # noqa: E402
from dmatmul import testing as ck  # noqa: E402
from dmatmul.testing import case as ck_case  # noqa: E402
from dmatmul.testing import draw as ck_draw  # noqa: E402
from dmatmul._spec import numpy_dtype  # noqa: E402
from dmatmul.backends.jax import _backend as jax_backend  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix, reference  # noqa: E402
from test_conformance import HypothesisChooser  # noqa: E402

LONG = os.environ.get("DMATMUL_LONG", "") not in ("", "0")
NDEV = len(jax.devices())


def _examples(ci: int, long: int) -> Any:
    return settings(max_examples=long if LONG else ci, deadline=None, derandomize=not LONG, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# --------------------------------------------------------------------------- #
# what every refusal must be
# --------------------------------------------------------------------------- #
@dataclasses.dataclass(frozen=True)
class Bad:
    """One corruption: the argument it changes, its new value, and what the
    error must say (``names``: regexes that must all match; ``given``: one of
    these renderings of what was given must be in the message)."""

    what: str  # a short description, for failures
    arg: str  # the argument changed
    value: Any
    names: tuple[str, ...]
    given: tuple[str, ...] = ()
    maybe_valid: bool = False  # a named algorithm: it may run after all (then it must be right)


def _snapshot(x: Any) -> Any:
    """Everything about an input that a call must leave as it was."""
    if isinstance(x, (np.ndarray, jax.Array)):
        if isinstance(x, jax.Array) and x.is_deleted():
            return ("deleted",)
        arr = np.asarray(x)
        return (type(x), arr.shape, str(arr.dtype), arr.tobytes(), getattr(x, "flags", None) and x.flags.writeable)
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_snapshot(v) for v in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _snapshot(v)) for k, v in x.items()))
    return (type(x), repr(x))


@contextlib.contextmanager
def _no_heavy_work(check: bool = True):
    """Fails if the JAX backend builds or runs a jitted product inside (where ``check``)."""
    built: list[str] = []
    real = jax_backend.JaxPlan._function

    def spy(self, kind):
        built.append(kind)
        return real(self, kind)

    with mock.patch.object(jax_backend.JaxPlan, "_function", spy):
        yield built
    assert not (check and built), f"the product was built or run ({built}) before the error"


def _assert_refused(call: Callable[[], Any], bad: Bad, inputs: dict[str, Any],
                    types: tuple[type[BaseException], ...] = (TypeError, ValueError)) -> BaseException | None:
    """``call()`` raises a typed error naming ``bad.arg`` and what was given,
    before any heavy work, leaving ``inputs`` as they were. Returns the error
    (None where ``bad.maybe_valid`` and it ran)."""
    before = {k: _snapshot(v) for k, v in inputs.items()}
    err: BaseException | None = None
    try:
        with _no_heavy_work(check=not bad.maybe_valid):
            call()
    except types as e:
        err = e
    except Exception as e:  # noqa: BLE001 - the point: any other type is a bug
        raise AssertionError(f"{bad.what}: {type(e).__name__} (not TypeError/ValueError): {e}") from e
    changed = [k for k, v in inputs.items() if _snapshot(v) != before[k]]
    assert not changed, f"{bad.what}: the input(s) {changed} were modified"
    if err is None:
        assert bad.maybe_valid, f"{bad.what}: no error"
        return None
    text = str(err)
    for word in bad.names:
        assert re.search(word, text), f"{bad.what}: {word!r} not in {type(err).__name__}: {text}"
    if bad.given:
        assert any(g in text for g in bad.given), f"{bad.what}: none of {bad.given} in {type(err).__name__}: {text}"
    return err


# --------------------------------------------------------------------------- #
# dm.matmul / dm.Matmul / reset_operands
# --------------------------------------------------------------------------- #
_DTYPES = ("float32", "float64", "float16", "bfloat16", "complex64", "complex128")
_X64 = ("float64", "complex128")
#: block sizes of a drawn BlockCyclic: small, larger than any matrix, and huge (beyond int64)
_BLOCKS = (1, 2, 3, 5, 64, 10**6, 2**63, 2**70)


@dataclasses.dataclass
class Valid:
    """A valid product: operands (global numpy values and what is passed) and keywords."""

    api: str  # "matmul", "Matmul" or "reset"
    dtype: str
    m: int
    n: int
    k: int
    nranks: int
    values: dict[str, np.ndarray | None]  # a, b, c, bias as numpy
    passed: dict[str, Any]  # a, b, c, bias as passed (numpy or jax)
    kw: dict[str, Any]
    fitting: list[str]
    grids: list[dm.ProcessGrid]

    def x64(self) -> Any:
        return jax.enable_x64(True) if self.dtype in _X64 else contextlib.nullcontext()

    def call(self, **changes: Any) -> Any:
        args = {**self.passed, **self.kw, **changes}
        a, b, c = args.pop("a"), args.pop("b"), args.pop("c")
        with self.x64():
            if self.api == "matmul":
                return dm.matmul(a, b, c, **args)
            with dm.Matmul(a, b, c, **args) as mm:
                mm.plan()
                return mm.execute()

    def reference(self) -> np.ndarray:
        v, kw = self.values, self.kw
        return reference(v["a"], v["b"], v["c"], alpha=kw["alpha"], beta=kw["beta"], transpose_a=kw["transpose_a"],
                         transpose_b=kw["transpose_b"], epilog=kw["epilog"], bias=v["bias"])

    def check(self, d: Any) -> None:
        assert_close(np.asarray(d), self.reference(), self.dtype)


def _as_family(x: np.ndarray, fam: str) -> Any:
    if fam == "numpy":
        return x
    with jax.enable_x64(x.dtype.name in _X64):
        return jnp.asarray(x)


@st.composite
def valid_products(draw: Any, api: str | None = None, mpi: int | None = None) -> Valid:
    """A valid call over the whole argument space (small sizes). ``mpi``: for
    that many processes (the global operands; every rank draws the same):
    distribution given, no ``devices=``."""
    data = draw(st.data())
    chooser = HypothesisChooser(data)
    api = api or draw(st.sampled_from(("matmul", "Matmul", "reset")))
    nranks = mpi or draw(st.sampled_from((1, 2, 3, 4, 6, 8)))
    dtype = draw(st.sampled_from(_DTYPES))
    m, n, k = (draw(st.integers(1, 9)) for _ in range(3))
    ta, tb = draw(st.booleans()), draw(st.booleans())
    earlier: list[dm.ProcessGrid] = []
    dists = []
    for _ in range(3):
        d = ck_draw._draw_distribution(chooser, nranks, earlier)
        if isinstance(d, dm.BlockCyclic):  # block sizes from 1 to huge
            d = dm.BlockCyclic(d.grid, (draw(st.sampled_from(_BLOCKS)), draw(st.sampled_from(_BLOCKS))),
                               d.first_process)
        dists.append(d)
    # (the generator draws a grid of another size now and then: refused, not valid)
    dists = [dm.Slab.X if d.grid is not None and d.grid.size != nranks else d for d in dists]
    form = draw(st.sampled_from(("triple", "triple", "single") + (("none",) if mpi is None else ())))
    distribution: Any = tuple(dists) if form == "triple" else dists[0] if form == "single" else None
    given = () if distribution is None else dists[:1] if form == "single" else dists
    grids = [d.grid for d in given if d.grid is not None]  # the grids of the distributions given
    fitting = ck_case._fitting_algorithms(nranks, tuple(dists) if form == "triple" else (dists[0],) * 3, ta, tb) \
        if distribution is not None else []
    algorithm = draw(st.sampled_from(["auto"] + fitting)) if fitting and draw(st.booleans()) else "auto"
    is_complex = dtype.startswith("complex")
    epilog = draw(st.sampled_from((None, "bias") if is_complex else dm.EPILOGS))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    a = random_matrix(rng, (k, m) if ta else (m, k), dtype)
    b = random_matrix(rng, (n, k) if tb else (k, n), dtype)
    use_c = draw(st.booleans())
    c = random_matrix(rng, (m, n), dtype) if use_c else None
    bias = random_matrix(rng, (m,), dtype) if epilog is not None and "bias" in epilog else None
    if bias is not None and draw(st.booleans()):
        bias = bias.reshape(m, 1)
    alpha = draw(st.sampled_from((1.0, -0.5, 2.0) + ((0.5 - 1j,) if is_complex else ())))
    beta = draw(st.sampled_from((0.0, 1.0, -2.0) + ((1j,) if is_complex else ()))) if use_c else 0.0
    devices_form = "none" if mpi else draw(st.sampled_from(("int", "int", "list") + (("none",) if nranks == NDEV
                                                                                    else ())))
    devices: Any = nranks if devices_form == "int" else None if devices_form == "none" else \
        list(draw(st.permutations(jax.devices()))[:nranks])
    families = {name: draw(st.sampled_from(("numpy", "jax"))) for name in ("a", "b", "c", "bias")}
    values = {"a": a, "b": b, "c": c, "bias": bias}
    passed = {name: None if x is None else _as_family(x, families[name]) for name, x in values.items()}
    kw = dict(distribution=distribution, alpha=alpha, beta=beta, transpose_a=ta, transpose_b=tb, epilog=epilog,
              bias=passed.pop("bias"), backend=draw(st.sampled_from(("auto", "jax"))), algorithm=algorithm,
              precision=draw(st.sampled_from((None, "default", "high", "highest"))), devices=devices)
    return Valid(api=api, dtype=dtype, m=m, n=n, k=k, nranks=nranks, values=values, passed=passed, kw=kw,
                 fitting=fitting, grids=grids)


def _shown(value: Any, *more: str) -> tuple[str, ...]:
    """How a message may show a given value: its repr (the start of it), its
    type's name, or (for a list or tuple) one of its items' reprs."""
    items = tuple(repr(v)[:20] for v in value) if isinstance(value, (list, tuple)) else ()
    return (repr(value)[:20], type(value).__name__, *items, *more)


def _name(arg: str) -> str:
    return rf"\b{re.escape(arg)}\b"


def _resized(arr: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``arr``'s values (repeated or cut) in an array of ``shape``."""
    return np.resize(arr.ravel(), math.prod(shape)).reshape(shape)


def _like(x: Any, value: np.ndarray) -> Any:
    """``value`` in the family of ``x`` (a jax.Array for a jax one)."""
    return _as_family(value, "jax" if isinstance(x, jax.Array) else "numpy")


#: wrong dtypes for a matrix operand (numpy can make all; jax only some)
_BAD_DTYPES = ("int8", "int32", "int64", "uint8", "bool", "object", "longdouble", "U1", "datetime64[s]")
_JAX_BAD_DTYPES = ("int8", "int32", "uint8", "bool")
#: what is not an array at all
_NON_ARRAYS: tuple[tuple[str, Any], ...] = (
    ("None", None), ("a string", "matrix"), ("an object", object()), ("a float", 3.5), ("a dict", {}),
    ("a ragged list", [[1.0, 2.0], [3.0]]), ("a list of strings", [["x", "y"]]), ("a set", {1.0}),
)
_BAD_NAMES: dict[str, tuple[Any, ...]] = {
    "epilog": ("RELU", "swish", "", "bias ", 1, True, b"relu", ["relu"], np.array(["relu", "bias"]), object()),
    "backend": ("cuda", "JAX", "", 1, None, ["jax"], np.array(["jax", "auto"]), object()),
    "algorithm": ("cannon", "SUMMA", "", 2, None, ["summa"], np.array(["local", "summa"]), object()),
    "precision": ("fast", "HIGHEST", "", 1, ("high", "high"), ["high"], np.array(["high", "default"]), object()),
}
_BAD_FLAGS = ("yes", 1, 0, None, np.array([True, False]), [True])
_BAD_DISTRIBUTIONS: tuple[tuple[str, Any], ...] = (
    ("a string", "Slab.X"), ("an int", 0), ("the Slab class", dm.Slab), ("a ProcessGrid", dm.ProcessGrid((2, 2))),
    ("a dict", {}), ("a pair", (dm.Slab.X, dm.Slab.Y)), ("four", (dm.Slab.X,) * 4), ("one", (dm.Slab.X,)),
    ("an array", np.array([dm.Slab.X] * 3, dtype=object)), ("a triple with None", (dm.Slab.X, None, dm.Slab.X)),
    ("a triple with a string", ("Slab.X", dm.Slab.Y, dm.Slab.X)),
)


def _operand_corruptions(v: Valid, name: str, x: Any, data: Any) -> list[Bad]:
    """Ways to get operand ``name`` (its passed value ``x``) wrong; for c and bias also when not given."""
    m, n = v.m, v.n
    out: list[Bad] = []
    jaxy = isinstance(x, jax.Array)
    if x is not None:
        arr = np.asarray(x)
        if name == "bias":
            shapes = [(1, m), (m, 2), (m, 1, 1), ()] if m > 1 else [(m, 2), (m, 1, 1), (), (2,)]
            for shape in shapes:
                bad = _like(x, _resized(arr, shape))
                out.append(Bad(f"bias of shape {shape}", name, bad, (_name(name),), (str(shape),)))
            d = data.draw(st.integers(1, 3))
            bad = _like(x, np.resize(arr.ravel(), m + d))
            out.append(Bad(f"bias of length M+{d}", name, bad, (_name(name),), (str((m + d,)),)))
        else:
            # (a trailing dimension more is a batch of matrices for a and b: wrong only for c)
            for shape in ((arr.size,), ()) + ((arr.shape + (1,),) if name == "c" else ()):
                bad = _like(x, _resized(arr, shape))
                out.append(Bad(f"{name} of shape {shape}", name, bad, (_name(name),), (str(shape),)))
        # wrong dtypes
        for dt in (_JAX_BAD_DTYPES if jaxy else _BAD_DTYPES):
            bad = arr.astype(object) if dt == "object" else np.ones(arr.shape, dt)
            if jaxy:
                bad = jnp.asarray(bad)
            shown = np.dtype(bad.dtype).name
            out.append(Bad(f"{name} of dtype {dt}", name, bad, (_name(name),), (shown,)))
        if name != "bias":
            other = data.draw(st.sampled_from([d for d in _DTYPES if d != v.dtype]), label=f"{name}'s other dtype")
            if not (jaxy and other in _X64):
                bad = _like(x, (arr if other.startswith("complex") else arr.real).astype(numpy_dtype(other)))
                names = (r"\ba\b", r"\bb\b") if name in ("a", "b") else (_name(name),)
                out.append(Bad(f"{name} of the other dtype {other}", name, bad, names, (np.dtype(bad.dtype).name,)))
        elif not v.dtype.startswith("complex"):
            bad = _like(x, arr.astype(np.complex64) + 1j)
            out.append(Bad("complex bias on real operands", name, bad, (_name(name), "complex"), ("complex64",)))
        # wrong shapes: the inner dimension, the result's
        d = data.draw(st.integers(1, 3), label=f"{name}'s size change")
        ta, tb = v.kw["transpose_a"], v.kw["transpose_b"]
        if name in ("a", "b"):
            axis = (0 if ta else 1) if name == "a" else (1 if tb else 0)  # K
            shape = list(arr.shape)
            shape[axis] += d
            bad = _like(x, np.resize(arr, shape))
            out.append(Bad(f"{name} with K+{d}", name, bad, (r"\ba\b", r"\bb\b"), (str(tuple(shape)),)))
            if v.values["c"] is not None or v.kw["bias"] is not None:  # M (of a) or N (of b) unlike c's / bias's
                if name == "a" or v.values["c"] is not None:
                    axis = ((1 if ta else 0) if name == "a" else (0 if tb else 1))
                    shape = list(arr.shape)
                    shape[axis] += d
                    bad = _like(x, np.resize(arr, shape))
                    # (the result's shape follows a and b: the error names c or bias, and the shape they imply)
                    m2, n2 = (m + d, n) if name == "a" else (m, n + d)
                    out.append(Bad(f"{name} with {'M' if name == 'a' else 'N'}+{d}, against c/bias", name, bad,
                                   (r"\b(c|bias)\b",), (str((m2, n2)), f"M={m2}")))
        elif name == "c":
            for shape in ((m + d, n), (m, n + d)) + (((n, m),) if m != n else ()):
                bad = _like(x, np.resize(arr, shape))
                out.append(Bad(f"c of shape {shape}", name, bad, (_name(name),), (str(shape),)))
    # not arrays at all
    for label, value in _NON_ARRAYS:
        if value is None and name == "c":
            continue  # c=None: no c, which is valid
        if value is None and name == "bias" and x is None:
            continue
        given = (type(value).__name__, repr(value), "dtype", "shape ()", "bias=None")
        if name == "bias" and x is None:  # (the mistake then: a bias without a bias epilog)
            given += ("bias is given but epilog",)
        out.append(Bad(f"{name} is {label}", name, value, (_name(name),), given))
    if x is None and name == "c":
        bad = np.ones((m + 1, n), numpy_dtype(v.dtype))
        out.append(Bad("c of the wrong shape where none was given", "c", bad, (r"\bc\b",), (str((m + 1, n)),)))
    if x is None and name == "bias":
        bad = np.ones(m, numpy_dtype(v.dtype))
        out.append(Bad("bias without a bias epilog", "bias", bad, (r"\bbias\b", "epilog"), (repr(v.kw["epilog"]),)))
    if x is not None and name == "bias":
        out.append(Bad("bias epilog without bias", "bias", None, (r"\bbias\b",), ("bias=None",)))
    return out


def _option_corruptions(v: Valid, data: Any) -> list[Bad]:
    out: list[Bad] = []
    for arg, values in _BAD_NAMES.items():
        for value in values:
            out.append(Bad(f"{arg}={value!r}", arg, value, (_name(arg),), (repr(value), type(value).__name__)))
    real = not v.dtype.startswith("complex")
    for arg in ("alpha", "beta"):
        bad_scalars: list[Any] = ["2", None, True, [1.0], np.array([1.0, 2.0]), 10**400, object()]
        if real:
            bad_scalars += [1j, 1 + 0j, np.complex64(2), complex("nan+nanj")]
        for value in bad_scalars:
            out.append(Bad(f"{arg}={value!r:.40}", arg, value, (_name(arg),),
                           (repr(value)[:20], type(value).__name__, "complex")))
    for arg in ("transpose_a", "transpose_b"):
        for value in _BAD_FLAGS:
            out.append(Bad(f"{arg}={value!r}", arg, value, (_name(arg),), (repr(value), type(value).__name__)))
    for label, value in _BAD_DISTRIBUTIONS:
        out.append(Bad(f"distribution is {label}", "distribution", value, (r"\bdistribution\b",),
                       _shown(value, "length")))
    # a grid that does not match the devices in use
    size = data.draw(st.sampled_from([s for s in (1, 2, 3, 4, 6, 8, 9) if s != v.nranks]), label="wrong grid size")
    rows = data.draw(st.sampled_from([r for r in range(1, size + 1) if size % r == 0]), label="its rows")
    grid = dm.ProcessGrid((rows, size // rows))
    wrong = data.draw(st.sampled_from((dm.BlockNonCyclic(grid), dm.BlockCyclic(grid, (2, 3)))), label="its kind")
    dist = v.kw["distribution"]
    triple = dist if isinstance(dist, tuple) else (dist,) * 3 if dist is not None else (dm.Slab.X,) * 3
    where = data.draw(st.integers(0, 2), label="which operand's grid")
    bad_triple = tuple(wrong if i == where else d for i, d in enumerate(triple))
    which = ("a", "b", "result")[where]
    out.append(Bad(f"the distribution of {which} on a grid of {size} on {v.nranks} devices", "distribution",
                   bad_triple, (rf"distribution of {which}", re.escape(str(grid.shape))), (f"{size} ranks",)))
    # devices
    devs = jax.devices()
    for value in (0, -1, 2.0, "2", True, [], [0, 1], ["x"], [devs[0], devs[0]], np.array(devs[:2]), NDEV + 1,
                  {devs[0]}):
        out.append(Bad(f"devices={value!r:.40}", "devices", value, (r"\bdevices\b",),
                       _shown(value, "empty", str(NDEV + 1))))
    if v.grids:  # a device count the grid does not span
        count = data.draw(st.sampled_from([s for s in range(1, NDEV + 1) if s != v.nranks]), label="device count")
        out.append(Bad(f"devices={count} for a grid of {v.nranks}", "devices", count,
                       (r"distribution of", r"\bdevices?\b"), (f"{count} device",)))
    # a named algorithm that does not fit (where the layouts are given: with none, dmatmul picks them)
    if v.kw["distribution"] is not None:
        unfit = [a for a in dm.ALGORITHMS if a not in v.fitting]
        if unfit:
            alg = data.draw(st.sampled_from(unfit), label="an algorithm that does not fit")
            out.append(Bad(f"algorithm={alg!r} (does not fit)", "algorithm", alg,
                           (re.escape(repr(alg)), "needs"), maybe_valid=True))
    return out


def _corruptions(v: Valid, data: Any) -> list[Bad]:
    out: list[Bad] = []
    for name in ("a", "b", "c", "bias"):
        x = v.kw["bias"] if name == "bias" else v.passed[name]
        out += _operand_corruptions(v, name, x, data)
    if v.api != "reset":
        out += _option_corruptions(v, data)
    return out


def _reset_corruptions(v: Valid, data: Any) -> list[Bad]:
    """What reset_operands must refuse: operands of another shape, dtype,
    family, or none at all; c or bias where the plan has none; bad alpha/beta."""
    out: list[Bad] = []
    for name in ("a", "b", "c", "bias"):
        x = v.kw["bias"] if name == "bias" else v.passed[name]
        if x is None:
            value = np.ones((v.m,) if name == "bias" else (v.m, v.n), numpy_dtype(v.dtype))
            out.append(Bad(f"reset {name} where the plan has none", name, value, (_name(name), "not given")))
            continue
        for bad in _operand_corruptions(v, name, x, data):
            if bad.value is None:  # None means: leave it as it is
                continue
            # (compared with the planned operand: the message shows what was given as a whole)
            shown = _shown(bad.value, str(tuple(np.shape(bad.value))) if hasattr(bad.value, "shape") else "",
                           np.dtype(bad.value.dtype).name if hasattr(bad.value, "dtype") else "")
            out.append(dataclasses.replace(bad, names=(_name(name),), given=bad.given + tuple(g for g in shown if g)))
        other = np.asarray(x)
        out.append(Bad(f"reset {name} as the other family", name,
                       _as_family(other, "numpy" if isinstance(x, jax.Array) else "jax"), (_name(name),),
                       ("jax", "numpy")))
    for arg in ("alpha", "beta"):
        values: list[Any] = ["2", True, [1.0], 10**400, object()]
        if not v.dtype.startswith("complex"):
            values += [1j, np.complex64(2)]
        for value in values:
            out.append(Bad(f"reset {arg}={value!r:.40}", arg, value, (_name(arg),),
                           (repr(value)[:20], type(value).__name__, "complex")))
    return out


def _run_valid(v: Valid) -> None:
    """The valid call runs and matches numpy. (The drawn named algorithm fits the
    layouts as far as dmatmul.testing's hint knows: where the planner still
    refuses it, saying so, the call is made valid with "auto".)"""
    try:
        d = v.call()
    except ValueError as e:
        if v.kw["algorithm"] == "auto" or "does not fit" not in str(e):
            raise
        v.fitting.remove(v.kw["algorithm"])
        v.kw["algorithm"] = "auto"
        d = v.call()
    v.check(d)


@given(v=valid_products(), data=st.data())
@_examples(ci=60, long=400)
def test_a_corrupted_matmul_call_raises_a_clear_typed_error(v, data):
    """dm.matmul and dm.Matmul: each corruption of one argument of a valid call."""
    _run_valid(v)
    bads = _corruptions(v, data) if v.api != "reset" else _reset_corruptions(v, data)
    picked = data.draw(st.lists(st.sampled_from(range(len(bads))), min_size=4, max_size=12, unique=True),
                       label="corruptions") if not LONG else range(len(bads))
    inputs = {**v.passed, "bias": v.kw["bias"]}
    if v.api == "reset":
        args = {**v.passed, **v.kw}
        a, b, c = args.pop("a"), args.pop("b"), args.pop("c")
        with v.x64(), dm.Matmul(a, b, c, **args) as mm:
            v.check(mm.execute())
            for i in picked:
                bad = bads[i]
                _assert_refused(lambda: mm.reset_operands(**{bad.arg: bad.value}), bad, {**inputs, "new": bad.value})
                v.check(mm.execute())  # the plan is as it was
        return
    for i in picked:
        bad = bads[i]
        changes = {bad.arg: bad.value}
        err = _assert_refused(lambda: v.call(**changes), bad, {**inputs, "new": bad.value})
        if err is None:  # a named algorithm that ran: it must be right
            v.check(v.call(**changes))
        v.check(v.call())  # nothing cached or changed by the refusal


def test_nan_and_inf_scalars_are_numbers_as_numpy_has_them():
    """NaN and inf alpha/beta are real numbers (BLAS and numpy propagate them):
    accepted, with numpy's result; complex ones on real operands are refused."""
    a, b, c = (np.ones(s, np.float32) for s in ((4, 3), (3, 5), (4, 5)))
    d = dm.matmul(a, b, c, alpha=float("nan"), beta=1.0, distribution=dm.Slab.X, devices=2)
    assert np.isnan(d).all()
    d = dm.matmul(a, b, c, alpha=1.0, beta=float("inf"), distribution=dm.Slab.X, devices=2)
    assert np.isposinf(d).all()
    with pytest.raises(TypeError, match="alpha.*complex"):
        dm.matmul(a, b, alpha=complex("nan+nanj"), distribution=dm.Slab.X, devices=2)


# --------------------------------------------------------------------------- #
# dm.split / dm.join and the distribution constructors
# --------------------------------------------------------------------------- #
@given(data=st.data())
@_examples(ci=60, long=2000)
def test_a_corrupted_split_or_join_raises_a_clear_typed_error(data):
    chooser = HypothesisChooser(data)
    nranks = data.draw(st.sampled_from((1, 2, 3, 4, 6, 8)), label="nranks")
    d = ck_draw._draw_distribution(chooser, nranks, [])
    if isinstance(d, dm.BlockCyclic):
        d = dm.BlockCyclic(d.grid, (data.draw(st.sampled_from(_BLOCKS)), data.draw(st.sampled_from(_BLOCKS))),
                           d.first_process)
    p = d.grid.size if d.grid is not None else nranks
    shape = (data.draw(st.integers(0, 9)), data.draw(st.integers(0, 9)))
    x = np.arange(math.prod(shape), dtype=np.float64).reshape(shape)
    blocks = dm.split(x, d, nranks=p)  # valid: each rank's block, and back
    assert len(blocks) == p and np.array_equal(dm.join(blocks, d, shape), x)
    bads: list[tuple[Bad, Callable[[], Any]]] = []
    for label, value in _NON_ARRAYS + (("1-D", x.ravel()), ("3-D", x[..., None])):
        if label == "a list of strings":
            continue  # (a matrix all the same: split takes any dtype)
        bad = Bad(f"split of {label}", "a", value, (r"\ba\b",), (type(value).__name__, "shape", "list"))
        bads.append((bad, lambda value=value: dm.split(value, d, nranks=p)))
    for label, value in _BAD_DISTRIBUTIONS[:6]:
        bad = Bad(f"split/join with distribution {label}", "d", value, (r"\bdistribution\b",),
                  (repr(value)[:12], type(value).__name__))
        bads.append((bad, lambda value=value: dm.split(x, value, nranks=p)))
        bads.append((bad, lambda value=value: dm.join(blocks, value, shape)))
    other = [q for q in (0, -1, 2.0, "2", True, None if d.grid is None else p + 1) if q is not None]
    for q in other:
        bad = Bad(f"split with nranks={q!r}", "nranks", q, (r"\bnranks\b",), (repr(q), type(q).__name__))
        bads.append((bad, lambda q=q: dm.split(x, d, nranks=q)))
    for value in ((shape[0], shape[1], 1), (-1, shape[1]), (float(shape[0]), shape[1]), "ab", shape[0], None,
                  (shape[0] + 1, shape[1]), (shape[0], shape[1] + 3), (2**40, shape[1]), (shape[0], 2**62)):
        bad = Bad(f"join with global_shape={value!r}", "global_shape", value,
                  (r"\b(global_shape|block)\b",), (repr(value)[:8], type(value).__name__, "shape"))
        bads.append((bad, lambda value=value: dm.join(blocks, d, value)))
    r = data.draw(st.integers(0, p - 1), label="the rank whose block is wrong")
    for label, value in (("None", None), ("a string", "x"), ("a ragged list", [[1.0], [1.0, 2.0]]),
                         ("one row more", np.vstack([blocks[r], np.zeros((1, blocks[r].shape[1]))])),
                         ("1-D", blocks[r].ravel()), ("transposed", blocks[r].T.copy() if blocks[r].shape[0]
                                                         != blocks[r].shape[1] else np.zeros((9, 10)))):
        bad_blocks = [value if i == r else blk for i, blk in enumerate(blocks)]
        bad = Bad(f"join with rank {r}'s block {label}", "blocks", value, (rf"\brank {r}\b|\bblock\b",),
                  ("shape", type(value).__name__))
        bads.append((bad, lambda bb=bad_blocks: dm.join(bb, d, shape)))
    for label, value in (("one block fewer", blocks[:-1]), ("one block more", blocks + [blocks[0]]),
                         ("an ndarray", np.zeros((p, 1, 1))), ("None", None), ("a string", "ab"), ("empty", [])):
        if label == "one block fewer" and (p == 1 or d.grid is None):
            continue  # (fewer blocks of a 1-D distribution: another rank count, maybe valid)
        if label == "one block more" and d.grid is None:
            continue
        bad = Bad(f"join of {label}", "blocks", value, (r"\b(blocks?|ranks?|nranks)\b",),
                  (type(value).__name__, "rank", "shape"))
        bads.append((bad, lambda value=value: dm.join(value, d, shape)))
    picked = data.draw(st.lists(st.sampled_from(range(len(bads))), min_size=5, max_size=15, unique=True),
                       label="corruptions") if not LONG else range(len(bads))
    for i in picked:
        bad, call = bads[i]
        _assert_refused(call, bad, {"x": x, "blocks": list(blocks), "value": bad.value})
    assert np.array_equal(dm.join(dm.split(x, d, nranks=p), d, shape), x)


_CONSTRUCTORS: tuple[tuple[str, Callable[[Any], Any], tuple[Any, ...]], ...] = (
    ("shape", lambda v: dm.ProcessGrid(v), ((0, 2), (-1, 2), (2.0, 2), "22", None, (), np.array([2, 2]), (True, 2))),
    ("layout", lambda v: dm.ProcessGrid((2, 2), layout=v),
     ("diag", "ROW", "", 0, None, ["row"], np.array(["row", "col"]))),
    ("block_sizes", lambda v: dm.BlockCyclic(dm.ProcessGrid((2, 2)), v),
     ((0, 2), (2, 0), (-1, 2), (1,), (1, 2, 3), 2, (1.5, 2), "ab", None, np.array([2, 2]), (2, -2**70))),
    ("first_process", lambda v: dm.BlockCyclic(dm.ProcessGrid((2, 2)), (2, 2), v),
     ((-1, 0), (2, 0), (0, 2), (0, 0, 0), 0, "00", (0.0, 0))),
    ("first_process", lambda v: dm.BlockNonCyclic(dm.ProcessGrid((2, 3)), v), ((0, 3), (2, 0), (-1, 0), None)),
    ("grid", lambda v: dm.BlockNonCyclic(v),
     ("g", None, (2, 2), dm.ProcessGrid(4), dm.ProcessGrid((2, 2, 2)), dm.Slab.X)),
    ("grid", lambda v: dm.BlockCyclic(v, (2, 2)), ("g", None, (2, 2), dm.ProcessGrid(4))),
    ("dim", lambda v: dm.Slab(v), (2, -1, "x", True, 0.0, None, 2**70)),
)


@pytest.mark.parametrize("arg, make, values", _CONSTRUCTORS, ids=[f"{c[0]}-{i}" for i, c in enumerate(_CONSTRUCTORS)])
def test_bad_distribution_arguments_are_refused_by_name(arg, make, values):
    """Every bad argument of ProcessGrid, Slab, BlockNonCyclic, BlockCyclic: a
    typed error naming it (and a grid of another dimension its shape)."""
    for value in values:
        bad = Bad(f"{arg}={value!r}", arg, value, (rf"\b{arg}|ProcessGrid|BlockCyclic|BlockNonCyclic|Slab\b",),
                  (repr(value)[:10], type(value).__name__, str(getattr(value, "shape", "")), "2-D"))
        _assert_refused(lambda value=value: make(value), bad, {"value": value})


# --------------------------------------------------------------------------- #
# dmatmul.jax blocks inside shard_map
# --------------------------------------------------------------------------- #
_OPS = ("allgather_matmul", "matmul_reduce_scatter")


def _in_shard_map(op: str, p: int, x: Any, y: Any, **kw: Any) -> Any:
    """``op(x, y, axis_name="i", **kw)`` in a shard_map over p devices, x and y
    replicated (each rank's block is the whole operand)."""
    mesh = jax.make_mesh((p,), ("i",), devices=jax.devices()[:p])
    out = P("i", None) if op == "matmul_reduce_scatter" else P()
    kw = {"axis_name": "i", **kw}
    return jax.shard_map(lambda: getattr(dmj, op)(x, y, **kw), mesh=mesh, in_specs=(), out_specs=out,
                         check_vma=False)()


@given(data=st.data())
@_examples(ci=5, long=200)
def test_a_corrupted_call_of_the_jax_blocks_raises_a_clear_typed_error(data):
    op = data.draw(st.sampled_from(_OPS), label="op")
    p = data.draw(st.sampled_from((1, 2, 4)), label="ring")
    m, k, n = (data.draw(st.integers(1, 6)) for _ in range(3))
    if op == "matmul_reduce_scatter":
        m *= p
    dtype = data.draw(st.sampled_from(("float32", "bfloat16", "complex64")), label="dtype")
    rng = np.random.default_rng(0)
    xv, yv = random_matrix(rng, (m, k), dtype), random_matrix(rng, (k, n), dtype)
    x, y = (data.draw(st.sampled_from((v, jnp.asarray(v))), label="family") for v in (xv, yv))
    precision = data.draw(st.sampled_from((None, "default", "highest")), label="precision")
    got = _in_shard_map(op, p, x, y, precision=precision)
    want = np.concatenate([xv] * p) @ yv if op == "allgather_matmul" else p * (xv @ yv)
    assert_close(np.asarray(got), want.astype(np.complex128 if dtype.startswith("c") else np.float64), dtype)
    bads: list[Bad] = []
    for name, v in (("x", x), ("y", y)):
        for label, value in _NON_ARRAYS:
            bads.append(Bad(f"{name} is {label}", name, value, (_name(name),), (type(value).__name__, "dtype",
                                                                                 "shape", "array")))
        arr = np.asarray(v)
        for shape in ((arr.size,), arr.shape + (1,), ()):
            bads.append(Bad(f"{name} of shape {shape}", name, _resized(arr, shape), (_name(name),), (str(shape),)))
        bads.append(Bad(f"{name} of dtype object", name, arr.astype(object), (_name(name),), ("object",)))
    bad_y = np.resize(np.asarray(y), (k + 1, n))
    bads.append(Bad("K of y differs", "y", bad_y, (r"\bx\b", r"\by\b"), (str((k + 1, n)),)))
    for value in ("j", 0, None, (), ("i", "i"), {}, {"i"}, np.array(["i"]), ["i", "j"]):
        bads.append(Bad(f"axis_name={value!r}", "axis_name", value, (r"\baxis_name\b",), _shown(value)))
    # precision and preferred_element_type: what jnp.dot refuses (the blocks take what it takes)
    for arg, values in (("precision", ("fast", "HIGHEST", 3, object(), np.array([1, 2]), ["high"] * 3, ("high",))),
                        ("preferred_element_type", ("foo", object(), 1, "x", "float"))):
        for value in values:
            try:
                jnp.dot(jnp.asarray(xv), jnp.asarray(yv), **{arg: value})
            except (TypeError, ValueError):
                bads.append(Bad(f"{arg}={value!r}", arg, value, (_name(arg),), _shown(value)))
    if op == "allgather_matmul":
        for value in ("yes", 1, None, np.array([True, False])):
            bads.append(Bad(f"bidirectional={value!r}", "bidirectional", value, (r"\bbidirectional\b",),
                            (repr(value),)))
    elif p > 1:
        bads.append(Bad("rows not a multiple of the ring", "x", np.asarray(x)[:-1] if m > 1 else
                        np.concatenate([np.asarray(x)] * (p + 1))[: p + 1], (r"\bx\b", "rows"), ("evenly",)))
    picked = data.draw(st.lists(st.sampled_from(range(len(bads))), min_size=4, max_size=10, unique=True),
                       label="corruptions") if not LONG else range(len(bads))
    for i in picked:
        bad = bads[i]
        args = {"x": x, "y": y, "precision": precision, bad.arg: bad.value}
        call_x, call_y = args.pop("x"), args.pop("y")
        _assert_refused(lambda: _in_shard_map(op, p, call_x, call_y, **args), bad,
                        {"x": x, "y": y, "value": bad.value})
    assert_close(np.asarray(_in_shard_map(op, p, x, y, precision=precision)),
                 want.astype(np.complex128 if dtype.startswith("c") else np.float64), dtype)
