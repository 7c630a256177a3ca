"""Process-level reproducibility settings: the AVX2 pins and the deterministic-algorithms switch."""

from __future__ import annotations

import subprocess
import sys

from xmr.reproducibility import PORTABLE_CPU_ENV, portable_cpu_numerics


def test_pins_only_what_is_unset_and_nothing_when_native():
    env = {"MKL_CBWR": "COMPATIBLE"}
    done = portable_cpu_numerics(env)
    assert done == {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
    assert env == {**PORTABLE_CPU_ENV, "MKL_CBWR": "COMPATIBLE"}  # the user's own setting stays
    native = {"XMR_NATIVE_CPU": "1"}
    assert portable_cpu_numerics(native) == {} and native == {"XMR_NATIVE_CPU": "1"}


def test_deterministic_switch_sets_torch_flags_without_importing_inductor():
    code = ("import sys, torch; from xmr.reproducibility import use_deterministic_algorithms as u; u(warn_only=True); "
            "print(torch.are_deterministic_algorithms_enabled(), "
            "torch.is_deterministic_algorithms_warn_only_enabled(), 'torch._inductor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]
