"""Named machines for the planner: built-in profiles of GPU nodes, each giving
the cost model (:class:`dmatmul._cost.MachineModel`) that ``dmatmul plan``
projects a product onto, without running anything.

A profile is one node of ``gpus_per_node`` GPUs joined by NVLink (through
NVSwitch: every GPU reaches every other at its full link bandwidth), nodes
joined by InfiniBand with one NIC per GPU. The model is two-level: a product
on one node communicates over NVLink; a product spanning several nodes pays
InfiniBand on its collectives, since each of dmatmul's collectives spans
every rank and a ring (NCCL's, or dmatmul's ``ppermute`` ring) over nodes
runs as fast as its slowest hop, the one from node to node (SUMMA's row
collectives may stay inside a node: they are costed at InfiniBand all the
same, an upper bound).

Sources and assumptions (published specifications, dense, no sparsity):

* H100 SXM5 80 GB (NVIDIA H100 datasheet): float16/bfloat16 989 TFLOP/s,
  fp8 1979, tf32 495, fp64 (tensor cores) 67; HBM3 3.35 TB/s.
* H200 SXM 141 GB (NVIDIA H200 datasheet): the H100's compute, HBM3e
  4.8 TB/s.
* B200 180 GB (NVIDIA DGX B200 / HGX B200 specifications): float16/bfloat16
  2250 TFLOP/s, fp8 4500, tf32 1100, fp64 40; HBM3e 8 TB/s.
* NVLink 4 (Hopper): 900 GB/s per GPU both ways, 450 GB/s each way; NVLink 5
  (Blackwell): 900 GB/s each way. The model's ``beta`` is a rank's time per
  byte *received*, so the link's one-way figure.
* InfiniBand NDR 400 Gb/s, one NIC per GPU: 50 GB/s each way per GPU.
* Latencies: a few microseconds. One ``ppermute`` step of a ring (a
  point-to-point message, one kernel launch and a handshake) 5 us on NVLink
  and 10 us on InfiniBand; one whole NCCL collective 10 us on a node and
  20 us across nodes (NCCL's own small-message latencies, rounded up).

float32 runs on tensor cores as tf32 (JAX's and cuBLAS' default precision for
float32 on these GPUs); complex products count 2mnk flops, as the planner
does, and run at a quarter of the real rate (four real GEMMs). A dtype a
profile gives no rate for is refused with the ones it has.

Achieved GEMM efficiency. No GEMM runs at the datasheet's peak: the planner
takes ``efficiency`` of it (0.65 on Hopper, 0.7 on Blackwell), the rate
cuBLAS reaches on large bfloat16 GEMMs under power and clock limits. The
Hopper figure is set from the published points docs/scale.md checks against:
JAX's Pallas collective matmul on H100 (per-shard M = 1024, K = N = 4096,
float16) runs its GEMMs at 64-68% of 989 TFLOP/s, PyTorch's overlapped
AG+GEMM (a 8192 x 8192 x 8192 GEMM per GPU) at 63%. Blackwell's 0.7 is an
assumption (no published point checked here).

``cpu``: this project's reference machine (2 cores, simulated JAX devices),
the defaults of :data:`dmatmul._cost.DEFAULT_MODELS`; ``here``: this machine
as calibrated (:func:`dmatmul._cost.model_for`), both with their measured
rates as peaks (efficiency 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from . import _cost

__all__ = ["Profile", "PROFILES", "MACHINES", "profile", "TF", "GB"]

TF = 1e12
GB = 1e9
US = 1e-6

#: the flop rate a complex product's 2mnk flops run at, against its real dtype's (four real GEMMs)
_COMPLEX = {"complex64": "float32", "complex128": "float64"}


@dataclasses.dataclass(frozen=True)
class Profile:
    """One machine: a node's GPUs, their peak rates, memory and links."""

    name: str
    summary: str
    #: dense peak flop/s per GPU, by dtype name (float32: tf32 on tensor cores)
    peak: Mapping[str, float]
    #: the fraction of ``peak`` a large GEMM reaches (see the module's docstring)
    efficiency: float
    #: HBM bandwidth (B/s) and capacity (B) per GPU
    hbm: float
    memory: float
    #: NVLink: bandwidth each way per GPU (B/s), one point-to-point step's and one collective's latency (s)
    link: float
    link_alpha: float
    link_collective_alpha: float
    #: InfiniBand: bandwidth each way per GPU (B/s), the same latencies across nodes
    network: float
    network_alpha: float
    network_collective_alpha: float
    gpus_per_node: int = 8
    #: whether this is one machine's measured model (``cpu``, ``here``): no nodes, a rank count of its own
    simulated: bool = False

    def peak_for(self, dtype: str) -> float:
        """Peak flop/s per GPU for ``dtype``'s 2mnk flops; ValueError naming the dtypes it has."""
        real = _COMPLEX.get(dtype, dtype)
        real = "float8" if real.startswith("float8") else real  # (both FP8 formats run at the FP8 tensor-core rate)
        if real not in self.peak:
            raise ValueError(f"machine {self.name!r} has no flop rate for dtype {dtype!r}; it has: "
                             f"{', '.join(sorted(self.peak))}")
        return self.peak[real] / (4 if dtype in _COMPLEX else 1)

    def ranks(self, nodes: int = 1) -> int:
        return self.gpus_per_node * nodes

    def model(self, dtype: str, nodes: int = 1) -> _cost.MachineModel:
        """The cost model of ``nodes`` nodes for ``dtype``: NVLink on one node,
        InfiniBand per GPU across several; GEMMs at ``efficiency`` of the peak.

        >>> m1, m2 = PROFILES["h100-nvl8"].model("bfloat16"), PROFILES["h100-nvl8"].model("bfloat16", nodes=2)
        >>> round(1 / m1.beta / 1e9), round(1 / m2.beta / 1e9), round(1 / m1.gamma / 1e12)
        (450, 50, 643)
        """
        if nodes < 1:
            raise ValueError(f"nodes must be >= 1, got {nodes}")
        across = nodes > 1
        bw = self.network if across else self.link
        return _cost.MachineModel(
            alpha=self.network_alpha if across else self.link_alpha,
            beta=1 / bw,
            gamma=1 / (self.efficiency * self.peak_for(dtype)),
            mem=1 / self.hbm,
            collective_alpha=self.network_collective_alpha if across else self.link_collective_alpha,
            collective_beta=1 / bw,
            overlap=True,
            duplex=True,
            source=f"profile {self.name}" + (f", {nodes} nodes over InfiniBand" if across else ""),
        )


_HOPPER = {"float16": 989 * TF, "bfloat16": 989 * TF, "float8": 1979 * TF, "float32": 495 * TF, "float64": 67 * TF}
_BLACKWELL = {"float16": 2250 * TF, "bfloat16": 2250 * TF, "float8": 4500 * TF, "float32": 1100 * TF,
              "float64": 40 * TF}

#: The built-in GPU machines, by name.
PROFILES: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("h100-nvl8", "8 x H100 SXM 80 GB, NVLink 4 (450 GB/s each way), IB NDR 400 Gb/s per GPU",
                _HOPPER, 0.65, hbm=3.35e12, memory=80 * GB, link=450 * GB, link_alpha=5 * US,
                link_collective_alpha=10 * US, network=50 * GB, network_alpha=10 * US,
                network_collective_alpha=20 * US),
        Profile("h200-nvl8", "8 x H200 SXM 141 GB, NVLink 4 (450 GB/s each way), IB NDR 400 Gb/s per GPU",
                _HOPPER, 0.65, hbm=4.8e12, memory=141 * GB, link=450 * GB, link_alpha=5 * US,
                link_collective_alpha=10 * US, network=50 * GB, network_alpha=10 * US,
                network_collective_alpha=20 * US),
        Profile("b200-nvl8", "8 x B200 180 GB, NVLink 5 (900 GB/s each way), IB NDR 400 Gb/s per GPU",
                _BLACKWELL, 0.70, hbm=8e12, memory=180 * GB, link=900 * GB, link_alpha=5 * US,
                link_collective_alpha=10 * US, network=50 * GB, network_alpha=10 * US,
                network_collective_alpha=20 * US),
    )
}

#: Every name ``dmatmul plan --machine`` takes: the profiles, ``cpu`` and ``here``.
MACHINES: tuple[str, ...] = (*PROFILES, "cpu", "here")


def _measured(name: str, model: _cost.MachineModel, ranks: int) -> Profile:
    """A machine known only by its model (``cpu``, ``here``): its measured GEMM rate is its peak."""
    rate = 1 / model.gamma if model.gamma > 0 else float("inf")
    bw = 1 / model.beta if model.beta > 0 else float("inf")
    summary = f"{ranks} simulated JAX devices; {model.describe()}"
    return Profile(name, summary, {d: rate for d in ("float16", "bfloat16", "float32", "float64")}, 1.0,
                   hbm=1 / model.mem if model.mem else bw, memory=0.0, link=bw, link_alpha=model.alpha,
                   link_collective_alpha=model.calpha, network=bw, network_alpha=model.alpha,
                   network_collective_alpha=model.calpha, gpus_per_node=ranks, simulated=True)


def profile(name: str, ranks: int = 8) -> tuple[Profile, _cost.MachineModel | None]:
    """The machine called ``name``, and for ``cpu`` and ``here`` the model it
    stands for (``ranks`` simulated devices: ``cpu`` the reference machine's
    defaults, ``here`` this machine's calibration, else the defaults). An
    unknown name raises ValueError listing the known ones.

    >>> profile("h200-nvl8")[0].memory / 1e9
    141.0
    """
    key = name.strip().lower()
    if key in PROFILES:
        return PROFILES[key], None
    if key in ("cpu", "here"):
        model = _cost.model_for("cpu", ranks, calibrated=key == "here")
        return _measured(key, model, ranks), model
    raise ValueError(f"unknown machine {name!r}; known machines: {', '.join(MACHINES)}")
