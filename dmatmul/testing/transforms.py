"""A case's JAX transformation (``jax.vjp``, ``jax.jvp``, ``jax.vmap``) around
``dm.matmul``: its inputs, the references of its outputs, and the run."""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any, cast

import numpy as np

from .case import Case, OnMesh
from .compare import _looser, _Result
from .reference import error_ratio, finite_scale, random_matrix, reference, reference_jvp, reference_vjp


class _TransformData:
    """The inputs of a case's :class:`Transform` (a cotangent, tangents or
    the batched operand: drawn after the operands, as jax.Arrays passed as
    the operands are), the references of its outputs, and the run."""

    def __init__(self, case: Case, rng: np.random.Generator, ops: dict[str, np.ndarray | None], ref: np.ndarray,
                 passed: Any) -> None:
        t = case.transform
        assert t is not None
        self.case, self.names = case, case.traced
        shapes = {"a": case.a_shape, "b": case.b_shape, "c": case.result_shape, "bias": case.bias_shape}
        dtypes = {"a": case.dtype, "b": case.dtype, "c": case.dtype, "bias": case.bias_dtype or case.dtype}
        kw: dict[str, Any] = dict(alpha=case.alpha, beta=case.beta, transpose_a=case.transpose_a,
                                  transpose_b=case.transpose_b, epilog=case.epilog, bias=ops["bias"])
        self.inputs: dict[str, Any] = {}
        what = t.describe()
        if t.kind == "vmap":
            one = cast(np.ndarray, ops[t.batched])
            stack = np.stack([one] + [random_matrix(rng, one.shape, case.dtype) for _ in range(t.size - 1)])
            self.inputs[f"{t.batched}, batched"] = passed(np.moveaxis(stack, 0, t.axis), t.batched, t.axis)
            refs = [reference(o["a"], o["b"], o["c"], **kw) for o in ({**ops, t.batched: x} for x in stack)]
            self.alternatives = [[_Result(f"{what}: result", None, np.stack(refs), (t.size,) + case.result_shape,
                                          kind="batched")]]
            return
        if t.kind == "vjp":
            g = random_matrix(rng, case.result_shape, case.dtype)
            self.inputs["cotangent"] = _as_jax(g)
        else:
            tangents = {n: random_matrix(rng, shapes[n], dtypes[n]) for n in self.names}
            self.inputs.update({f"tangent of {n}": passed(x, n) for n, x in tangents.items()})
        # where no traced operand reaches the result (an empty one; or K = 0 or alpha = 0, C not read or not
        # traced, bias not traced), JAX makes its tangent a zero of its own, on its default device: its placement is not checked
        reached = math.prod(case.result_shape) > 0 and ((case.k > 0 and case.alpha != 0)
                                           or ("c" in self.names and case.beta != 0) or "bias" in self.names)
        # each alternative: the outputs, each with its reference. relu has no derivative at an exact 0 of its
        # input (half-precision data meets some, as C and bias cancel): dmatmul may take 0 (jax.nn.relu's),
        # 0.5 (jnp.maximum's) or 1 there, the same everywhere (the alternative that fits best is checked)
        relu = case.epilog in ("relu", "relu_bias")
        self.alternatives = []
        for at_zero in (0.0, 0.5, 1.0) if relu else (0.0,):
            said = f"{what} (relu'(0) = {at_zero})" if relu else what
            if t.kind == "vjp":
                grads = reference_vjp(ops["a"], ops["b"], ops["c"], g, **kw, relu_at_zero=at_zero)
                expected = [_Result(f"{said}: result", None, ref)] + [
                    _Result(f"{said}: gradient of {n}", None, grads[n], shapes[n], dtypes[n],
                            _looser(case.dtype, dtypes[n]), "gradient") for n in self.names]
            else:
                tangent = reference_jvp(ops["a"], ops["b"], ops["c"], tangents, **kw, relu_at_zero=at_zero)
                expected = [_Result(f"{said}: result", None, ref),
                            _Result(f"{said}: tangent", None, tangent,
                                    tolerance=_looser(case.dtype, *(dtypes[n] for n in self.names)),
                                    kind="result" if reached else "gradient")]
            if not any(all(np.array_equal(x.ref, y.ref, equal_nan=True) for x, y in zip(e, expected))
                       for e in self.alternatives):
                self.alternatives.append(expected)

    def run(self, call: Any, args: dict[str, Any], on: OnMesh | None, mesh: Any) -> list[_Result]:
        """The transformation of ``call`` over the traced operands (the others
        closed over), called as the case says (eagerly, inside ``jax.jit``,
        on a user's mesh...): its outputs, each with its reference."""
        import jax

        case, names, t = self.case, self.names, self.case.transform
        assert t is not None
        prims = tuple(self.inputs[f"{n}, batched"] if t.kind == "vmap" and n == t.batched else args[n]
                      for n in names)

        def f(*xs: Any) -> Any:
            ops = {**args, **dict(zip(names, xs))}
            return call(ops["a"], ops["b"], ops["c"], ops["bias"])

        extra: Any = None
        if t.kind == "vjp":
            extra = self.inputs["cotangent"]

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: the cotangent
                out, pull = jax.vjp(f, *prims)
                if not isinstance(out, jax.core.Tracer) and jax.typeof(out).sharding.mesh.explicit_axes:
                    # eagerly, a result typed on Explicit axes gets its cotangent laid out as it is, as a JAX
                    # user's (jnp.ones_like(out), or upstream values) is: one left on one device is what JAX
                    # cannot transpose a sum or a select onto (jax.vjp(lambda x: x - x.sum(), x) fails the same)
                    extra = jax.device_put(extra, out.sharding)
                return (out, *pull(extra))
        elif t.kind == "jvp":
            extra = tuple(self.inputs[f"tangent of {n}"] for n in names)

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: the tangents
                return jax.jvp(f, prims, extra)
        else:
            in_axes = tuple(t.axis if n == t.batched else None for n in names)

            def apply(prims: tuple[Any, ...], extra: Any) -> Any:  # extra: None
                return (jax.vmap(f, in_axes=in_axes)(*prims),)

        if (on is None and not case.jit) or (on is not None and on.call == "eager"):
            outs = apply(prims, extra)
        elif on is None or on.call != "jit on constants":
            with jax.set_mesh(mesh) if on is not None and on.call == "jit under set_mesh" else contextlib.nullcontext():
                outs = jax.jit(apply)(prims, extra)
        else:
            outs = jax.jit(lambda: apply(prims, extra))()
        return self._best([[dataclasses.replace(r, value=x) for r, x in zip(e, outs, strict=True)]
                           for e in self.alternatives])

    def _best(self, alternatives: list[list[_Result]]) -> list[_Result]:
        """The alternative whose worst error is the smallest (the first where that cannot be read)."""
        def worst(results: list[_Result]) -> float:
            try:
                ratios = [error_ratio(np.asarray(r.value), r.ref, r.tolerance or r.dtype or self.case.dtype,
                                      finite_scale(r.ref)) if np.shape(r.value) == r.ref.shape else math.inf
                          for r in results]
            except Exception:  # noqa: BLE001 - the check of the chosen one says what
                return math.inf
            return max(ratios, default=0.0)
        return alternatives[0] if len(alternatives) == 1 else min(alternatives, key=worst)


def _as_jax(x: np.ndarray) -> Any:
    """``x`` as a jax.Array of its dtype (64-bit ones too)."""
    import jax
    import jax.numpy as jnp

    with jax.enable_x64(x.dtype.name in ("float64", "complex128")):
        return jnp.asarray(x)
