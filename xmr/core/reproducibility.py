"""Process-level CPU numerics settings (imports nothing heavy: it must run before torch is imported).

The default is the machine's own kernels: the fastest this CPU runs, and the same numbers on the same machine
every time. ``XMR_PORTABLE_CPU=1`` pins torch's kernels to AVX2 and OpenBLAS to Haswell's, which makes x86-64
CPUs *of one vendor* agree bit for bit; it does not make an Intel and an AMD CPU agree (MKL takes other paths
on each), and it costs up to 1.8x in evaluation on an AVX-512 Intel CPU. Figures and the decision:
docs/speed.md, "CPU kernels: the decision"."""

from __future__ import annotations

import os

#: instruction-set pins of ``XMR_PORTABLE_CPU=1`` (torch's ATen, MKL and oneDNN kernels to AVX2)
PORTABLE_CPU_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
#: NumPy's and SciPy's OpenBLAS (HGLMM's ICA/GMM fit): its Haswell kernels. Forced kernels are not checked
#: against the CPU, so this one is only set where the CPU has AVX2 and FMA (else: illegal instruction).
OPENBLAS_PIN = {"OPENBLAS_CORETYPE": "Haswell"}
#: the opt-in switch (``XMR_NATIVE_CPU``, the former opt-out, is accepted and changes nothing: native is the default)
PORTABLE_SWITCH = "XMR_PORTABLE_CPU"


def _cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(ln.split(":", 1)[1].split()) for ln in f if ln.startswith("flags")), set())
    except OSError:
        return set()


def _on(env, name: str) -> bool:
    return env.get(name, "0") not in ("", "0")


def portable_cpu_numerics(environ: dict | None = None, cpu_flags: set[str] | None = None) -> dict[str, str]:
    """With ``XMR_PORTABLE_CPU=1`` (and not ``XMR_NATIVE_CPU=1``), pin torch's CPU kernels to AVX2 before torch is
    imported, so a run gives the same numbers on every x86-64 CPU of the same vendor with AVX2 (an AVX-512 machine
    otherwise picks other kernels, with another reduction order, in ATen's vectorised ops, MKL's GEMM and oneDNN's
    convolutions), and OpenBLAS (NumPy, SciPy, scikit-learn) to its Haswell kernels where the CPU has AVX2 and FMA
    (``cpu_flags``: default /proc/cpuinfo's). Each variable is only set when unset. Without the switch nothing is
    set: the machine's fastest kernels. Returns what was set.
    """
    env = os.environ if environ is None else environ
    if not _on(env, PORTABLE_SWITCH) or _on(env, "XMR_NATIVE_CPU"):
        return {}
    pins = dict(PORTABLE_CPU_ENV)
    if "OPENBLAS_CORETYPE" not in env and {"avx2", "fma"} <= (_cpu_flags() if cpu_flags is None else cpu_flags):
        pins.update(OPENBLAS_PIN)  # /proc/cpuinfo is read only when the pin could still be set
    done = {}
    for k, v in pins.items():
        if k not in env:
            env[k] = v
            done[k] = v
    return done


def use_deterministic_algorithms(warn_only: bool = True, fill_uninitialized_memory: bool = False) -> None:
    """``torch.use_deterministic_algorithms(True)`` without the 1-2 s per process of the ``torch._inductor``
    (and sympy) import that the public call makes only to set inductor's flag: xmr never compiles, so that flag
    is moot. When inductor is already loaded (a user's ``torch.compile``), the public call sets both.

    Deterministic mode also makes torch fill every ``torch.empty`` with NaN (``torch.utils.deterministic.
    fill_uninitialized_memory``), a guard against kernels that read memory they never wrote. No xmr kernel does
    (every synth recipe trains to the same history either way: benchmarks/bench_nan_fill.py), and a VSE∞ step at
    COCO shape makes about 1,100 such fills (bench_train.py --profile): memsets that cost no measurable time on a
    CPU but are an extra kernel launch each on a GPU. So they are off unless ``fill_uninitialized_memory``
    (``train.fill_uninitialized_memory``) asks for them."""
    import sys

    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if "torch._inductor.config" in sys.modules or setter is None:
        torch.use_deterministic_algorithms(True, warn_only=warn_only)
    else:
        setter(True, warn_only=warn_only)
    torch.utils.deterministic.fill_uninitialized_memory = fill_uninitialized_memory
