"""Run as a separate process with TRITON_INTERPRET=1 (Triton reads it when it is imported): decodes with the
Triton kernel under its interpreter and with the torch path, and prints the largest difference."""

from __future__ import annotations

import sys

from txl.kernels import prefer

from .helpers import tiny_model
from .test_kernels import _decode_both_ways


def main() -> None:
    same_length = sys.argv[1] == "same_length"
    model = tiny_model(seed=24, mem_len=11, same_length=same_length, clamp_len=4)
    with prefer("triton"):  # the "kernel" side; the reference side forces the torch path itself
        got, expected = _decode_both_ways(model, [0, 3, 11, 25], mem_len=11, block_size=4, steps=2)
    print(float((got - expected).abs().max()))


if __name__ == "__main__":
    main()
