"""What every kernel body shares: the local GEMM (:func:`contract`), the
epilogue, and the per-rank problem (:class:`LocalProblem`)."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax

from .... import _epilogue
from ...._plan import Kernel
from ...._problem import Spec, Via

#: ``precision=`` as :class:`dmatmul._options.Options` holds it, as ``lax.dot_general`` takes it
PRECISIONS: dict[str | None, lax.Precision | None] = {
    None: None, "default": lax.Precision.DEFAULT, "high": lax.Precision.HIGH, "highest": lax.Precision.HIGHEST,
}


def traced_platform() -> str:
    """The platform of the devices being traced for: the abstract mesh's
    (inside ``shard_map`` or under ``jax.set_mesh``), else JAX's default."""
    device = getattr(jax.sharding.get_abstract_mesh(), "abstract_device", None)
    return getattr(device, "platform", None) or jax.default_backend()


def widens(platform: str, dtype: Any, acc_dtype: Any) -> bool:
    """Whether operands of ``dtype`` accumulated in ``acc_dtype`` are widened
    to float32 on ``platform``: half precisions accumulated in float32, on
    CPU. XLA's CPU dot thunk refuses some BF16 x BF16 = F32 dots at run time
    ("UNIMPLEMENTED: Unsupported element type for DotThunk") and the CPU has
    no half-precision GEMM to lose; its copies and collectives carry a 2-byte
    float element by element through float32, converting the whole
    destination again at each update, so a product widens its operands before
    they move, not only for the GEMM (:meth:`_compile.CompiledProduct._core`;
    ``python benchmarks/half_moves.py``). Exact: every half-precision value is
    a float32 one."""
    dt = jnp.dtype(dtype)
    return (platform == "cpu" and dt.itemsize == 2 and jnp.issubdtype(dt, jnp.floating)
            and acc_dtype is not None and jnp.dtype(acc_dtype) == jnp.float32)


def contract(a: jax.Array, b: jax.Array, ka: int, kb: int, precision: Any, dtype: Any) -> jax.Array:
    """The 2-D product contracting axis ``ka`` of ``a`` with axis ``kb`` of ``b``
    (``a.T @ b`` is ``contract(a, b, 0, 0, ...)``), no transpose materialized;
    ``precision`` and ``dtype`` (``preferred_element_type``) as ``lax.dot_general``.

    Half-precision operands are widened first where :func:`widens` says, on
    the platform the product runs on (the mesh being traced), not JAX's
    default backend: CPU devices of a GPU machine widen too."""
    platform = traced_platform()
    if widens(platform, a.dtype, dtype) and widens(platform, b.dtype, dtype):
        a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return lax.dot_general(a, b, (((ka,), (kb,)), ((), ())), precision=precision, preferred_element_type=dtype)


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """``epilog(alpha * acc + beta * C + bias)`` of one product, cast to its dtype."""

    spec: Spec

    @property
    def alpha(self) -> complex:
        """alpha with FP8's scales folded in (``alpha * sa * sb``): applied once, to
        the float32 accumulator, not to each operand nor at each ring step."""
        return self.spec.scaled_alpha

    beta = Via[complex]("spec")
    epilog = Via[Any]("spec")
    use_c = Via[bool]("spec")
    has_bias = Via[bool]("spec")
    bias_columns = Via[bool]("spec")

    @property
    def out_dtype(self) -> Any:
        return jnp.dtype(self.spec.result_dtype)


def finish(ep: Epilogue, acc: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
    """Apply the epilogue to an accumulator (a local block or a global matrix)."""
    return _epilogue.apply(
        jnp, acc, alpha=ep.alpha, beta=ep.beta, c=c if ep.use_c else None, bias=bias if ep.has_bias else None,
        epilog=ep.epilog, out_dtype=ep.out_dtype, bias_columns=ep.bias_columns,
    )


@dataclasses.dataclass(frozen=True)
class SummaSchedule:
    """SUMMA's K panels: step ``t`` multiplies the ``width`` columns of op(A)
    held by grid column ``owner_col[t]`` at local offset ``offset_a[t]`` with the
    ``width`` rows of op(B) held by grid row ``owner_row[t]`` at ``offset_b[t]``."""

    width: int
    owner_col: tuple[int, ...]
    offset_a: tuple[int, ...]
    owner_row: tuple[int, ...]
    offset_b: tuple[int, ...]
    extent_a: int = 0  # local K extent the panels read (a shorter last panel reads zeros after it)
    extent_b: int = 0

    def longest_run(self) -> int:
        """The most k one grid column of op(A) and one grid row of op(B) hold at
        consecutive local positions: the widest textbook panel (``width``, their
        greatest common length, is 1 where uneven blocks cut K into runs such as
        18, 17, 1, 17, 17).

        >>> SummaSchedule(2, (0, 0, 1, 1, 1), (0, 2, 0, 2, 4), (0, 1, 1, 1, 1), (0, 0, 0, 2, 4)).longest_run()
        6
        """
        longest = run = 1
        for t in range(1, len(self.owner_col)):
            same = (self.owner_col[t], self.owner_row[t]) == (self.owner_col[t - 1], self.owner_row[t - 1])
            follows = (self.offset_a[t], self.offset_b[t]) == (self.offset_a[t - 1] + self.width,
                                                               self.offset_b[t - 1] + self.width)
            run = run + 1 if same and follows else 1
            longest = max(longest, run)
        return longest * self.width


@dataclasses.dataclass(frozen=True)
class LocalProblem:
    """What a body needs to know: ranks, transposes, padded block sizes."""

    spec: Spec
    kernel: Kernel
    nranks: int
    axis: Any  # the mesh axis (or axes) that enumerates the ranks
    block: dict[str, int]  # padded block length of each split logical dim ("M", "K", "N")
    bias_axis: Any = None  # the mesh axis splitting the result's dimension the bias runs along (sliced along it)
    bias_block: int = 0
    summa: SummaSchedule | None = None
    # whether a ring's next transfer may be issued beside the GEMM it does not feed (GPU, TPU:
    # XLA overlaps them). False on CPU, where XLA's collectives are synchronous, so nothing
    # overlaps anyway: each SUMMA step then receives its block and multiplies it, so the block
    # sent and the step's product never coexist (peak one block lower)
    overlap: bool = True

    transpose_a = Via[bool]("spec")
    transpose_b = Via[bool]("spec")

    @property
    def acc_dtype(self) -> Any:
        return jnp.dtype(self.spec.dtype_info.accumulator)

    @property
    def precision(self) -> lax.Precision | None:
        return PRECISIONS[self.spec.precision]

    @property
    def axes(self) -> dict[str, int]:
        """Axis of each logical dim in the stored local blocks."""
        ka = 0 if self.transpose_a else 1
        kb = 1 if self.transpose_b else 0
        return {"aK": ka, "aM": 1 - ka, "bK": kb, "bN": 1 - kb}

    def mm(self, a: jax.Array, b: jax.Array) -> jax.Array:
        """op(a) @ op(b) in the accumulation dtype."""
        ax = self.axes
        return contract(a, b, ax["aK"], ax["bK"], self.precision, self.acc_dtype)

    def take(self, x: jax.Array, axis: int, dim: str, j: jax.Array, part: tuple[int, int] | None = None) -> jax.Array:
        """Block ``j`` of logical dim ``dim`` (stored axis ``axis``) of a local
        array; its positions ``start:stop`` only, given ``part``."""
        size = self.block[dim]
        start, stop = part or (0, size)
        return lax.dynamic_slice_in_dim(x, j * size + start, stop - start, axis=axis)

    @property
    def both_ways(self) -> bool:
        """Whether the ring runs both ways (:func:`ring_parts`)."""
        return self.kernel.schedule == "bidirectional"


def varying_zeros(shape: tuple[int, ...], dtype: Any, axis: Any) -> jax.Array:
    """Zeros typed as varying over ``axis`` (a name or tuple; ``()``: plain zeros),
    as a ``fori_loop`` carry that will hold varying values must be."""
    return lax.pcast(jnp.zeros(shape, dtype), axis, to="varying")


def _rounds_in_the_gemm(ep: Epilogue, acc_dtype: Any) -> bool:
    """Whether a local GEMM may write ``ep``'s result dtype itself: a plain
    product (alpha 1, no C, bias or activation) of a half precision accumulated
    in float32, on an accelerator (whose GEMMs accumulate half precisions in
    float32 and round once; on CPU :func:`contract` widens instead)."""
    out = jnp.dtype(ep.out_dtype)
    return (ep.alpha == 1 and not ep.use_c and not ep.has_bias and ep.epilog is None and out.itemsize == 2
            and out != jnp.dtype(acc_dtype) and traced_platform() != "cpu")


def item_product(item: Spec) -> Any:
    """``epilog(alpha * op(a) @ op(b) + beta * c + bias)`` of one item's matrices."""
    ka = 0 if item.transpose_a else 1
    kb = 1 if item.transpose_b else 0
    precision, acc = PRECISIONS[item.precision], jnp.dtype(item.dtype_info.accumulator)
    ep = Epilogue(item)

    def f(a: jax.Array, b: jax.Array, c: jax.Array | None, bias: jax.Array | None) -> jax.Array:
        return finish(ep, contract(a, b, ka, kb, precision, acc), c, bias)

    return f
