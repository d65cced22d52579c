"""The ``dmatmul.Matmul`` plan driven through long random sequences of calls
(a hypothesis ``RuleBasedStateMachine``), on the JAX backend and on nvmath
through the simulated nvmath-python of ``tests/gpu/_fake_nvmath.py``.

Up to three plans live at once (some of them the same problem, so that they
share the backend's cached plan). Each is built from drawn shapes (uneven,
prime, 1, now and then 0), dtypes, transposes, alpha/beta with or without C,
epilogs with a bias, distributions drawn independently for a, b and the
result (row- and column-major grids), numpy operands in any memory layout
and jax.Arrays (on one device or on a mesh of the user's). The rules then
plan, execute (eagerly, or inside ``jax.jit``), reset some operands and
scalars, reset with bad arguments, change the caller's numpy operands in
place, scribble on earlier results, delete a jax.Array operand, free,
free again, use the freed plan, and leave a ``with`` block by an exception.
What the contract (section 3) and docs/ promise is checked after every
step:

* every result equals numpy's product of the plan's *current* operands;
* the plan reads the caller's arrays when it runs (a numpy operand changed
  in place after ``reset_operands`` is seen by the next ``execute``, as the
  nvmath backend documents and the JAX backend does); a jax.Array the
  caller deleted is refused by name until it is replaced;
* the caller's inputs are never modified (nor a jax.Array deleted); results
  are the caller's: a later execute never overwrites an earlier one, and a
  result scribbled on changes nothing else;
* a bad ``reset_operands`` raises a TypeError/ValueError raised by dmatmul
  that names the operand, and the plan goes on with its previous operands;
* ``.algorithm`` and ``explain()`` do not change across ``reset_operands``
  of new operands (new scalars are compiled in: the plan is made anew);
* after ``free()`` (or a ``with`` block left by an exception) every method
  raises :class:`dmatmul.PlanFreedError`, never a JAX or numpy error;
  ``free()`` again does nothing; ``algorithm``/``explain()`` say what the
  plan was where it was made.

CI runs a bounded, derandomized set of sequences; ``DMATMUL_LONG=1`` runs
many more, new ones each run.
"""

from __future__ import annotations

import os
import pathlib
import traceback
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, \
    run_state_machine_as_test

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import dmatmul as dm  # noqa: E402
from dmatmul import testing as ck  # noqa: E402
from dmatmul.testing import case as ck_case  # noqa: E402
from dmatmul.testing import draw as ck_draw  # noqa: E402
from dmatmul._epilogue import EPILOGS  # noqa: E402
from dmatmul.testing.reference import assert_close, random_matrix, reference  # noqa: E402

LONG = os.environ.get("DMATMUL_LONG", "") not in ("", "0")
PACKAGE = pathlib.Path(dm.__file__).resolve().parent

SIZES = (1, 2, 3, 5, 7, 8, 11, 13, 16)
DTYPES = ("float32", "float64", "complex64", "float16", "bfloat16", "complex128")
PLACEMENTS = ("none", "rows", "cols", "grid")  # dmatmul's own (ck.OnMesh.is_dmatmuls)
MAX_LIVE = 3


def _alphas(dtype: str) -> tuple[complex, ...]:
    return (1.0, 0.5, -1.5, 0.0) + ((0.5 - 0.25j, 1j) if dtype.startswith("complex") else (2.25,))


def _betas(dtype: str) -> tuple[complex, ...]:
    return (0.0, 1.0, -0.5, 2.0) + ((0.5 + 1j,) if dtype.startswith("complex") else ())


def _from_dmatmul(e: BaseException) -> bool:
    """Whether ``e`` was raised by dmatmul's own code (a typed refusal), not by JAX or numpy inside it."""
    frames = traceback.extract_tb(e.__traceback__)
    return bool(frames) and pathlib.Path(frames[-1].filename).resolve().is_relative_to(PACKAGE)


class Entry:
    """One Matmul and what the model knows of it."""

    def __init__(self, config: dict[str, Any], mm: dm.Matmul, ops: dict[str, Any], kinds: dict[str, Any]) -> None:
        self.config = config  # the construction's draws (a twin is built from them)
        self.mm = mm
        self.ops = ops  # name -> the caller's object the plan holds now (None: not given)
        self.kinds = kinds  # name -> ("numpy", layout) or ("jax", placement)
        self.alpha, self.beta = config["alpha"], config["beta"]
        self.freed = False
        self.planned = False  # a plan was made (algorithm/explain answer after free)
        self.refusal: BaseException | None = None  # the named algorithm does not fit: every planning call says so
        self.told: tuple[str, str] | None = None  # (algorithm, explain()) last seen
        self.on_mesh = False  # a, b or c on a mesh of the user's, no devices=: the result comes back there

    @property
    def dtype(self) -> str:
        return self.config["dtype"]

    def reference(self) -> np.ndarray:
        cfg = self.config
        return reference(*(np.asarray(self.ops[n]) if self.ops[n] is not None else None for n in ("a", "b", "c")),
                         alpha=self.alpha, beta=self.beta, transpose_a=cfg["ta"], transpose_b=cfg["tb"],
                         epilog=cfg["epilog"], bias=None if self.ops["bias"] is None else np.asarray(self.ops["bias"]))

    @property
    def family(self) -> str:
        return "jax" if any(self.kinds[n][0] == "jax" for n in ("a", "b", "c") if self.ops[n] is not None) else "numpy"


class PlanStates(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.entries: list[Entry] = []
        self.inputs: list[tuple[Any, np.ndarray]] = []  # every array passed in, and what it must still hold
        self.results: list[tuple[Any, np.ndarray, str, str]] = []  # (result, reference, dtype, what)
        self.rng = np.random.default_rng(0)

    # -- operands -------------------------------------------------------------
    def _value(self, shape: tuple[int, ...], dtype: str) -> np.ndarray:
        return random_matrix(self.rng, shape, dtype)

    def _mesh(self, cfg: dict[str, Any]) -> Mesh:
        devs = jax.devices()[: cfg["nranks"]]
        devs = devs[::-1] if cfg["mesh_reversed"] else devs
        return Mesh(np.array(devs, dtype=object).reshape(cfg["mesh_shape"]), ("data", "model")[: len(cfg["mesh_shape"])])

    def _passed(self, x: np.ndarray, kind: tuple[str, str], cfg: dict[str, Any], *, record: bool = True) -> Any:
        """``x`` as the caller passes it: numpy in a memory layout, or a jax.Array placed as ``kind`` says."""
        fam, how = kind
        if fam == "numpy":
            y = ck.lay_out(x, how)
        else:
            with jax.enable_x64(x.dtype.name in ("float64", "complex128")):
                y = jnp.asarray(x)
                if how != "plain":
                    on = ck.OnMesh(shape=cfg["mesh_shape"], explicit=True, reversed=cfg["mesh_reversed"],
                                   call="eager", placements=(how,) * 3)
                    y = on.put(y, self._mesh(cfg), how) if y.ndim == 2 else \
                        jax.device_put(y, NamedSharding(self._mesh(cfg), PartitionSpec()))
        if record:
            self.inputs.append((y, np.array(np.asarray(y))))
        return y

    def _shapes(self, cfg: dict[str, Any]) -> dict[str, tuple[int, ...]]:
        m, n, k = cfg["m"], cfg["n"], cfg["k"]
        return {"a": (k, m) if cfg["ta"] else (m, k), "b": (n, k) if cfg["tb"] else (k, n), "c": (m, n),
                "bias": {"M": (m,), "M,1": (m, 1), "1,N": (1, n)}[cfg["bias_shape"]]}

    def _kind(self, data: st.DataObject, cfg: dict[str, Any], name: str, fam: str) -> tuple[str, str]:
        if fam == "jax":
            return ("jax", "plain" if cfg["mesh_shape"] is None else data.draw(st.sampled_from(PLACEMENTS)))
        dtype = cfg["bias_dtype"] if name == "bias" else cfg["dtype"]
        layouts = ck.LAYOUTS[:5] if name == "bias" else ck.LAYOUTS
        layouts = tuple(x for x in layouts if x != "byte-swapped" or dtype != "bfloat16")
        return ("numpy", "C" if data.draw(st.integers(0, 3)) else data.draw(st.sampled_from(layouts)))

    # -- construction -----------------------------------------------------------
    def _draw_config(self, data: st.DataObject) -> dict[str, Any]:
        backend = data.draw(st.sampled_from(("jax", "jax", "jax", "nvmath")), label="backend")
        nranks = 1 if backend == "nvmath" else data.draw(st.integers(1, 8), label="nranks")
        dtype = data.draw(st.sampled_from(DTYPES), label="dtype")
        cplx = dtype.startswith("complex")
        rare_zero = lambda: data.draw(st.integers(0, 15)) == 15  # noqa: E731
        m, n, k = (0 if rare_zero() else data.draw(st.sampled_from(SIZES)) for _ in range(3))
        ch = ck.NumpyChooser(data.draw(st.integers(0, 2**32 - 1), label="distribution seed"))
        dists: Any = None
        if data.draw(st.integers(0, 7)):
            earlier: list[Any] = []
            cyclic: list[Any] = []
            dists = tuple(ck_draw._draw_distribution(ch, nranks, earlier, cyclic) for _ in range(3))
        epilog = data.draw(st.sampled_from((None, "bias") if cplx else EPILOGS), label="epilog")
        bias_dtype = dtype
        if epilog is not None and epilog.endswith("bias") and data.draw(st.integers(0, 3)) == 3:
            bias_dtype = data.draw(st.sampled_from([d for d in DTYPES if cplx or not d.startswith("complex")]))
        ta, tb = data.draw(st.booleans(), label="ta"), data.draw(st.booleans(), label="tb")
        algorithm = "auto"
        if data.draw(st.integers(0, 5)) == 5:
            fitting = ck_case._fitting_algorithms(nranks, dists, ta, tb) if dists is not None else []
            algorithm = data.draw(st.sampled_from(fitting or list(dm.ALGORITHMS)), label="algorithm")
        jax_ok = backend == "jax"
        fams = {name: (data.draw(st.sampled_from(("numpy", "jax"))) if jax_ok else "numpy")
                for name in ("a", "b", "c", "bias")}
        mesh_shape = None
        if jax_ok and nranks > 1 and "jax" in fams.values() and data.draw(st.booleans()):
            mesh_shape = data.draw(st.sampled_from([(nranks,)] + [s for s in ck_case._factorizations(nranks)
                                                                  if min(s) > 1]), label="mesh")
        use_c = data.draw(st.booleans(), label="use_c")
        return dict(
            backend=backend, nranks=nranks, dtype=dtype, m=m, n=n, k=k, ta=ta, tb=tb, distribution=dists,
            alpha=data.draw(st.sampled_from(_alphas(dtype)), label="alpha"),
            beta=data.draw(st.sampled_from(_betas(dtype) if use_c else (0.0,)), label="beta"),  # (beta needs c)
            use_c=use_c, epilog=epilog, bias_dtype=bias_dtype,
            bias_shape=data.draw(st.sampled_from(("M", "M,1", "1,N"))), algorithm=algorithm, fams=fams,
            mesh_shape=mesh_shape,
            mesh_reversed=data.draw(st.booleans()),
            precision=data.draw(st.sampled_from((None, "default", "highest")), label="precision"),
            devices_given=mesh_shape is None or data.draw(st.booleans()),
        )

    def _build(self, data: st.DataObject, cfg: dict[str, Any]) -> None:
        shapes = self._shapes(cfg)
        given = ["a", "b"] + ["c"] * cfg["use_c"] + ["bias"] * (cfg["epilog"] is not None
                                                                and cfg["epilog"].endswith("bias"))
        kinds = {name: self._kind(data, cfg, name, cfg["fams"][name]) for name in given}
        ops: dict[str, Any] = {"a": None, "b": None, "c": None, "bias": None}
        for name in given:
            ops[name] = self._passed(self._value(shapes[name], cfg["bias_dtype"] if name == "bias" else cfg["dtype"]),
                                     kinds[name], cfg)
        # devices= left out only where a, b or c is on the user's mesh (its devices are then the ranks)
        on_mesh = any(kinds[n][0] == "jax" and kinds[n][1] != "plain" for n in given if n != "bias")
        given_devices = cfg["backend"] == "jax" and (cfg["devices_given"] or not on_mesh)
        devices = {"devices": cfg["nranks"]} if given_devices else {}
        try:
            mm = dm.Matmul(ops["a"], ops["b"], ops["c"], distribution=cfg["distribution"], alpha=cfg["alpha"],
                           beta=cfg["beta"], transpose_a=cfg["ta"], transpose_b=cfg["tb"], epilog=cfg["epilog"],
                           bias=ops["bias"], backend=cfg["backend"], algorithm=cfg["algorithm"],
                           precision=cfg["precision"], **devices)
        except (dm.DistributionError, ValueError) as e:  # a drawn grid of another size than the ranks
            assert isinstance(e, dm.DistributionError) and _from_dmatmul(e), repr(e)
            return
        self.entries.append(Entry(cfg, mm, ops, kinds))
        self.entries[-1].on_mesh = on_mesh and not given_devices

    @initialize(data=st.data())
    def first(self, data: st.DataObject) -> None:
        self.rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1), label="value seed"))
        self._build(data, self._draw_config(data))

    @precondition(lambda self: sum(not e.freed for e in self.entries) < MAX_LIVE)
    @rule(data=st.data())
    def construct(self, data: st.DataObject) -> None:
        self._build(data, self._draw_config(data))

    @precondition(lambda self: self.entries and sum(not e.freed for e in self.entries) < MAX_LIVE)
    @rule(data=st.data())
    def construct_twin(self, data: st.DataObject) -> None:
        """The problem of an earlier plan again, new values: the two share the backend's cached plan."""
        self._build(data, self._pick(data).config)

    # -- helpers ------------------------------------------------------------------
    def _pick(self, data: st.DataObject) -> Entry:
        return data.draw(st.sampled_from(self.entries), label="plan")

    def _planning(self, e: Entry, call: Any) -> Any:
        """``call()`` of a live plan: a named algorithm that does not fit, or a grid of another size than the
        ranks (drawn now and then), is refused, alike every time."""
        try:
            out = call()
        except (ValueError, dm.DistributionError) as err:
            assert _from_dmatmul(err), "".join(traceback.format_exception(err))
            dists = e.config["distribution"] or ()
            if any(d.grid is not None and d.grid.size != e.config["nranks"] for d in dists):
                assert isinstance(err, dm.DistributionError) and "ranks" in str(err), repr(err)
            else:
                assert f"algorithm='{e.config['algorithm']}'" in str(err), repr(err)
            if e.refusal is not None:
                assert type(err) is type(e.refusal) and str(err) == str(e.refusal)
            e.refusal = err
            return None
        assert e.refusal is None, f"refused before ({e.refusal!r}), not now"
        e.planned = True
        return out

    def _told(self, e: Entry) -> None:
        """``algorithm`` and ``explain()`` of a live plan: what they said before (if anything)."""
        told = self._planning(e, lambda: (e.mm.algorithm, e.mm.explain()))
        if told is None:
            return
        assert told[0] in dm.ALGORITHMS, told
        assert f"algorithm:  {told[0]}" in told[1] and "backend:    " in told[1]
        if e.told is not None:
            assert told == e.told, f"changed since last asked:\n{e.told[1]}\n---\n{told[1]}"
        e.told = told

    def _check_result(self, e: Entry, d: Any, what: str, *, traced: bool = False) -> None:
        cfg = e.config
        want_family = "jax" if traced else e.family
        if want_family == "numpy":
            assert type(d) is np.ndarray and d.flags.writeable, (what, type(d))
        else:
            assert isinstance(d, jax.Array), (what, type(d))
            if e.on_mesh and not traced:
                assert d.sharding.device_set == set(self._mesh(cfg).devices.flat), (what, d.sharding)
        assert np.dtype(d.dtype).name == e.dtype, (what, d.dtype)
        assert tuple(d.shape) == (cfg["m"], cfg["n"]), (what, d.shape)
        ref = e.reference()
        assert_close(np.asarray(d), ref, e.dtype)
        self.results.append((d, ref, e.dtype, what))

    # -- rules ---------------------------------------------------------------------
    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def plan(self, data: st.DataObject) -> None:
        e = self._pick(data)
        if e.freed:
            with pytest.raises(dm.PlanFreedError, match="freed"):
                e.mm.plan()
            return
        self._planning(e, e.mm.plan)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def algorithm_and_explain(self, data: st.DataObject) -> None:
        e = self._pick(data)
        if not e.freed:
            self._told(e)
            return
        for read in (lambda: e.mm.algorithm, e.mm.explain):
            if e.planned and e.refusal is None:  # what the plan was
                said = read()
                assert said in e.told if e.told is not None else said in dm.ALGORITHMS or "algorithm:  " in said
            else:
                with pytest.raises(dm.PlanFreedError, match="freed before it was made"):
                    read()

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def execute(self, data: st.DataObject) -> None:
        e = self._pick(data)
        if e.freed:
            with pytest.raises(dm.PlanFreedError, match="freed"):
                e.mm.execute()
            return
        d = self._planning(e, e.mm.execute)
        if d is not None:
            self._check_result(e, d, "execute()")

    @rule(data=st.data())
    def execute_in_jit(self, data: st.DataObject) -> None:
        """docs/jax.md: a Matmul planned outside jit may be executed inside."""
        pool = [e for e in self.entries if e.config["backend"] == "jax"]
        if not pool:
            return
        e = data.draw(st.sampled_from(pool), label="plan")
        if e.freed:
            with pytest.raises(dm.PlanFreedError, match="freed"):
                jax.jit(lambda: e.mm.execute())()
            return
        d = self._planning(e, lambda: jax.jit(lambda: e.mm.execute())())
        if d is not None:
            self._check_result(e, d, "jax.jit(lambda: mm.execute())()", traced=True)

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        """New values of the same shapes (a subset of the operands, by position or keyword), new scalars."""
        e = self._pick(data)
        cfg = e.config
        shapes = self._shapes(cfg)
        names = [n for n in ("a", "b", "c", "bias") if e.ops[n] is not None and data.draw(st.booleans())]
        new = {}
        for n in names:
            fam = e.kinds[n][0]
            kind = self._kind(data, cfg, n, fam) if fam == "numpy" or e.kinds[n][1] != "plain" else e.kinds[n]
            new[n] = (self._passed(self._value(shapes[n], cfg["bias_dtype"] if n == "bias" else cfg["dtype"]),
                                   kind, cfg), kind)
        scalars = {}
        if data.draw(st.integers(0, 3)) == 3:
            scalars["alpha"] = data.draw(st.sampled_from(_alphas(e.dtype)))
        if data.draw(st.integers(0, 3)) == 3:
            scalars["beta"] = data.draw(st.sampled_from(_betas(e.dtype) if e.ops["c"] is not None else (0.0,)))
        args: list[Any] = []
        kwargs = {n: x for n, (x, _) in new.items()}
        if data.draw(st.booleans()):  # a and b (and c) by position, as the signature allows
            for n in ("a", "b", "c"):
                if n in kwargs and all(m in kwargs for m in ("a", "b", "c")[: ("a", "b", "c").index(n)]):
                    args.append(kwargs.pop(n))
        if e.freed:
            with pytest.raises(dm.PlanFreedError, match="freed"):
                e.mm.reset_operands(*args, **kwargs, **scalars)
            return
        e.mm.reset_operands(*args, **kwargs, **scalars)
        for n, (x, kind) in new.items():
            e.ops[n], e.kinds[n] = x, kind
        if (scalars.get("alpha", e.alpha), scalars.get("beta", e.beta)) != (e.alpha, e.beta):
            # scalars are compiled in: the next plan is made anew, for the operands it then has
            e.alpha, e.beta = scalars.get("alpha", e.alpha), scalars.get("beta", e.beta)
            e.told = None

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def bad_reset(self, data: st.DataObject) -> None:
        """A mistake in reset_operands: a typed error naming the operand; the plan goes on as it was."""
        e = self._pick(data)
        cfg = e.config
        shapes = self._shapes(cfg)
        given = [n for n in ("a", "b", "c", "bias") if e.ops[n] is not None]
        name = data.draw(st.sampled_from(("a", "b", "c", "bias")), label="operand")
        dtype = cfg["bias_dtype"] if name == "bias" else cfg["dtype"]
        shape = shapes[name]
        kinds = ["missing"] if name not in given else \
            ["shape", "dtype", "3-D", "string"] + (["family"] if cfg["backend"] == "jax" else []) + \
            (["devices"] if e.kinds[name][0] == "jax" else [])
        how = data.draw(st.sampled_from(kinds + ["keyword", "alpha", "complex alpha"]), label="mistake")
        words = [name]
        kwargs: dict[str, Any] = {}
        if how == "missing":
            kwargs[name] = self._passed(self._value(shape, dtype), ("numpy", "C"), cfg)
            words = [name, "not given"]
        elif how == "shape":
            bad = (shape[0] + 1,) + shape[1:]
            kwargs[name] = self._passed(self._value(bad, dtype), e.kinds[name] if e.kinds[name][0] == "numpy"
                                        else ("jax", "plain"), cfg)
            words = [name, str(bad)]
        elif how == "dtype":
            other = data.draw(st.sampled_from([d for d in DTYPES if d != dtype]))
            kwargs[name] = self._passed(self._value(shape, other), ("numpy", "C"), cfg) if e.kinds[name][0] == \
                "numpy" else self._passed(self._value(shape, other), ("jax", "plain"), cfg)
            words = [name, other]
        elif how == "3-D":
            kwargs[name] = self._passed(self._value((2,) + shape, dtype), ("numpy", "C"), cfg)
        elif how == "string":
            kwargs[name] = "hello"
        elif how == "family":
            other = "jax" if e.kinds[name][0] == "numpy" else "numpy"
            kwargs[name] = self._passed(self._value(shape, dtype), (other, "plain" if other == "jax" else "C"), cfg)
            words = [name, other]
        elif how == "devices":  # a jax.Array on other devices than the planned one's
            x = self._passed(self._value(shape, dtype), ("jax", "plain"), cfg, record=False)
            planned = e.ops[name].sharding.device_set
            spare = [d for d in jax.devices() if {d} != planned]
            kwargs[name] = jax.device_put(x, spare[-1])
            self.inputs.append((kwargs[name], np.array(np.asarray(kwargs[name]))))
            words = [name, "device"]
        elif how == "keyword":
            kwargs["d"] = self._passed(self._value(shapes["c"], cfg["dtype"]), ("numpy", "C"), cfg)
            words = ["'d'"]
        elif how == "alpha":
            kwargs["alpha"] = data.draw(st.sampled_from(("2", True, None.__class__, [1.0])))
            words = ["alpha"]
        else:
            kwargs["alpha"] = 1 + 2j if not e.dtype.startswith("complex") else "2j"
            words = ["alpha"]
        # good new values for the other operands in the same call: none of them may be taken either
        for other in given:
            if other != name and other not in kwargs and data.draw(st.booleans()):
                value = self._value(shapes[other], cfg["bias_dtype"] if other == "bias" else cfg["dtype"])
                kwargs[other] = self._passed(value, e.kinds[other], cfg)
        with pytest.raises((TypeError, ValueError, dm.PlanFreedError)) as info:
            e.mm.reset_operands(**kwargs)
        err = info.value
        if e.freed:
            assert isinstance(err, dm.PlanFreedError) or isinstance(err, TypeError) and how == "keyword", repr(err)
            return
        assert _from_dmatmul(err), "".join(traceback.format_exception(err))
        for w in words:
            assert w in str(err), (w, str(err))
        d = self._planning(e, e.mm.execute)  # the previous operands, as if nothing had been asked
        if d is not None:
            self._check_result(e, d, f"execute() after a refused reset_operands ({how} {name})")

    @rule(data=st.data())
    def change_inputs_in_place(self, data: st.DataObject) -> None:
        """The caller writes new values into a numpy operand the plan holds, of any layout (a
        byte-swapped one too): the next execute reads them."""
        pool = [(e, n) for e in self.entries for n in ("a", "b", "c", "bias")
                if e.ops[n] is not None and e.kinds[n][0] == "numpy" and e.ops[n].flags.writeable]
        if not pool:
            return
        e, n = data.draw(st.sampled_from(pool), label="operand")
        x = e.ops[n]
        x[...] = self._value(x.shape, np.dtype(x.dtype).newbyteorder("=").name)
        for i, (y, _) in enumerate(self.inputs):
            if y is x:
                self.inputs[i] = (x, np.array(x))

    @rule(data=st.data())
    def delete_a_jax_operand(self, data: st.DataObject) -> None:
        """The caller deletes a jax.Array the plan holds: execute() refuses, naming it, until it is reset."""
        pool = [(e, n) for e in self.entries for n in ("a", "b", "c", "bias")
                if not e.freed and e.ops[n] is not None and e.kinds[n][0] == "jax"]
        if not pool:
            return
        e, n = data.draw(st.sampled_from(pool), label="operand")
        x = e.ops[n]
        self.inputs = [(y, want) for y, want in self.inputs if y is not x]
        x.delete()
        with pytest.raises(ValueError, match=f"{n} is a deleted jax.Array"):
            e.mm.execute()
        shape = self._shapes(e.config)[n]
        e.ops[n] = self._passed(self._value(shape, e.config["bias_dtype"] if n == "bias" else e.dtype), e.kinds[n],
                                e.config)
        e.mm.reset_operands(**{n: e.ops[n]})

    @precondition(lambda self: any(type(d) is np.ndarray and d.size for d, *_ in self.results))
    @rule(data=st.data())
    def scribble_on_a_result(self, data: st.DataObject) -> None:
        """A numpy result is the caller's: writing it changes nothing else (checked by the invariants)."""
        i = data.draw(st.sampled_from([i for i, (d, *_) in enumerate(self.results)
                                       if type(d) is np.ndarray and d.size]), label="result")
        d, _, dtype, what = self.results[i]
        d[...] = 7
        self.results[i] = (d, np.full(d.shape, 7.0), dtype, what + ", then set to 7")

    @precondition(lambda self: self.entries)
    @rule(data=st.data())
    def free(self, data: st.DataObject) -> None:
        """free(), free() twice (idempotent), or a with block left by an exception (which frees; on a
        freed plan it raises PlanFreedError)."""
        e = self._pick(data)
        how = data.draw(st.sampled_from(("free()", "free() twice", "with")), label="how")
        if how != "with":
            e.mm.free()
            if how == "free() twice":
                e.mm.free()
        elif e.freed:  # a with statement on a freed plan raises, as any other use of it
            with pytest.raises(dm.PlanFreedError, match="with statement on a freed Matmul"):
                with e.mm:
                    raise AssertionError("entered a freed plan")
        else:

            class Boom(Exception):
                pass

            with pytest.raises(Boom):
                with e.mm as mm:
                    assert mm is e.mm
                    if data.draw(st.booleans()):
                        self._planning(e, mm.plan)
                    raise Boom
        e.freed = True
        assert "freed" in repr(e.mm)

    # -- invariants -------------------------------------------------------------------
    @invariant()
    def inputs_untouched(self) -> None:
        for x, want in self.inputs:
            if isinstance(x, jax.Array):
                assert not x.is_deleted(), "a caller's jax.Array was deleted (donated?)"
            assert np.array_equal(np.asarray(x), want, equal_nan=True), "a caller's input was modified"

    @invariant()
    def results_kept(self) -> None:
        for d, ref, dtype, what in self.results:
            try:
                assert_close(np.asarray(d), ref, dtype)
            except AssertionError as err:
                raise AssertionError(f"an earlier result ({what}) changed: {err}") from None

    def teardown(self) -> None:
        for e in self.entries:
            e.mm.free()


def _settings() -> settings:
    if LONG:
        return settings(max_examples=400, stateful_step_count=30, deadline=None,
                        suppress_health_check=list(HealthCheck))
    return settings(max_examples=100, stateful_step_count=15, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck))


@pytest.mark.filterwarnings("error::UserWarning")  # e.g. JAX's "float64 ... will be truncated" from dmatmul's code
def test_plan_states(fake_nvmath, monkeypatch):
    # a small cache of nvmath plans: plans borrowed by live Matmuls are evicted now and then
    monkeypatch.setattr(type(dm.backends.get("nvmath")), "cache_size", 2)
    run_state_machine_as_test(PlanStates, settings=_settings())

