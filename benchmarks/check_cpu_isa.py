"""Are CPU results tied to the instruction set? Runs the same EfficientNet-Lite0 forward, BiGRU and matmul in
subprocesses with torch's kernels pinned to AVX2 (what `XMR_PORTABLE_CPU=1` asks of every `xmr` command,
xmr/core/reproducibility.py) and with the machine's native kernels (the default), and prints a digest of each output.
On an AVX-512 machine the native digests differ from the pinned ones wherever a kernel has an AVX-512 variant;
pinned runs match any AVX2 machine.

    python benchmarks/check_cpu_isa.py
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

CHILD = r'''
import hashlib, torch
from xmr.config.loader import load_backbone_config
from xmr.features.backbones import build_backbone
torch.manual_seed(0)
net = build_backbone(load_backbone_config("efficientnet_lite0_128", "config"))
with torch.no_grad():
    feats = net(torch.rand(8, 3, 128, 128))[0]
    gru = torch.nn.GRU(50, 64, bidirectional=True, batch_first=True)(torch.randn(16, 12, 50))[0]
    prod = torch.randn(512, 1280) @ torch.randn(1280, 256)
digest = lambda t: hashlib.sha1(t.contiguous().numpy().tobytes()).hexdigest()[:12]
print(torch.backends.cpu.get_cpu_capability(), digest(feats), digest(gru), digest(prod))
'''


def run(env: dict[str, str]) -> list[str]:
    from xmr.core.reproducibility import PORTABLE_CPU_ENV

    base = {k: v for k, v in os.environ.items() if k not in PORTABLE_CPU_ENV}  # the child decides
    out = subprocess.run([sys.executable, "-c", CHILD], env={**base, **env}, capture_output=True, text=True,
                         check=True)
    return out.stdout.strip().splitlines()[-1].split()  # the backbone prints a line while loading


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    from xmr.core.reproducibility import PORTABLE_CPU_ENV

    pinned = run({**PORTABLE_CPU_ENV, "XMR_PORTABLE_CPU": "1"})
    native = run({})
    print(f"{'kernels':<10} {'ISA':<8} {'CNN features':<14} {'BiGRU':<14} {'matmul':<14}")
    for name, row in (("pinned", pinned), ("native", native)):
        print(f"{name:<10} {row[0]:<8} {row[1]:<14} {row[2]:<14} {row[3]:<14}")
    same = [p == n for p, n in zip(pinned[1:], native[1:])]
    print("native == pinned:", ", ".join(f"{k} {'yes' if s else 'NO'}" for k, s in zip(("cnn", "gru", "matmul"), same)))


if __name__ == "__main__":
    main()
