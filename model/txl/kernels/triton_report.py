"""The Triton kernels (decoding attention, top-p's masses) compiled ahead of time for a GPU architecture, with no GPU present: Triton's own LLVM
and the ptxas it ships. Reports what each variant costs a GPU: registers, spills, shared memory, barriers.

A kernel that spills keeps part of its state in local (off-chip) memory, which a memory-bound kernel cannot
afford; a kernel that does not compile for a shape fails on its first GPU step. Both show here, on a CPU.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import triton_decode, triton_sampling

_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Variant:
    """One compiled form of a kernel: the GPU architecture (80: A100, 90: H100) and the compile-time constants."""

    kernel: str  # "partitions", "combine" (decoding attention) or "masses" (top-p's search)
    arch: int
    kv_dtype: str = "float32"  # the pool's dtype ("float32", "float16", "bfloat16"); the others read float32
    d_head: int = 64
    block_size: int = 16
    split: bool = True

    def label(self) -> str:
        if self.kernel == "combine":
            return f"combine sm_{self.arch} d_head {self.d_head}"
        if self.kernel == "masses":
            return f"top-p masses sm_{self.arch} ({triton_sampling.PIVOTS} pivots)"
        mode = "split" if self.split else "single pass"
        return f"partitions sm_{self.arch} {self.kv_dtype} d_head {self.d_head} bs {self.block_size} ({mode})"


@dataclass(frozen=True)
class Usage:
    registers: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int
    stack: int  # bytes of stack frame (local memory)
    shared: int  # bytes of shared memory per program
    barriers: int  # bar.sync instructions in the PTX
    warps: int

    @property
    def spills(self) -> bool:
        return self.spill_stores > 0 or self.spill_loads > 0


def toolchain_missing() -> str | None:
    """Why kernels cannot be compiled ahead of time here (None: they can)."""
    if triton_decode.triton is None:
        return "Triton is not installed"
    try:
        from triton.backends.nvidia.compiler import get_ptxas
    except ImportError:
        return "Triton's CUDA backend is not installed"
    try:
        path = get_ptxas(90).path
    except Exception as exc:  # Triton raises its own error types for a missing tool
        return f"Triton's ptxas is not available ({exc})"
    if not Path(path).exists():
        return f"Triton's ptxas is not available ({path})"
    return None


def standard_variants(archs: tuple[int, ...] = (80, 90)) -> list[Variant]:
    """The variants a server compiles: the pool's three dtypes at d_head 64 (wt103) and 128, split and single
    pass at the default block size, the combining kernel, and top-p's masses."""
    variants = []
    for arch in archs:
        for dtype in _DTYPES:
            for d_head in (64, 128):
                variants.append(Variant("partitions", arch, dtype, d_head))
        variants.append(Variant("partitions", arch, "bfloat16", 64, split=False))
        for d_head in (64, 128):
            variants.append(Variant("combine", arch, "float32", d_head))
        variants.append(Variant("masses", arch))
    return variants


def compile_variant(variant: Variant) -> Usage:
    """Compiles `variant` for its architecture and reads ptxas's account of it."""
    partitions, combine = triton_decode.jit_kernels()
    block_d = 1 << max(0, variant.d_head - 1).bit_length()
    if variant.kernel == "partitions":
        kv = _DTYPES[variant.kv_dtype]
        signature = {name: "*fp32" for name in ("q", "bd", "part_max", "part_sum", "part_acc", "out")}
        signature |= {"keys": f"*{kv}", "values": f"*{kv}"}
        signature |= {name: "*i64" for name in ("table", "starts", "klens", "windows")}
        signature |= {n: "i32" for n in ("B", "H", "S", "NB", "P", "window_stride", "partition", "num_parts")}
        constants = {
            "D": variant.d_head,
            "BS": variant.block_size,
            "BLOCK_D": block_d,
            "TILE": triton_decode.tile_keys(variant.d_head),
            "SPLIT": variant.split,
        }
        return compile_kernel(
            partitions, signature, constants, arch=variant.arch, warps=triton_decode.NUM_WARPS
        )
    if variant.kernel == "masses":
        signature = {"logits": "*fp32", "normaliser": "*fp32", "pivots": "*i32", "out": "*fp32"}
        signature |= {name: "i32" for name in ("V", "row_stride", "parts")}
        constants = {
            "J": triton_sampling.PIVOTS,
            "BLOCK": triton_sampling.BLOCK,
            "ITERS": triton_sampling.BLOCKS_PER_PROGRAM,
        }
        return compile_kernel(
            triton_sampling.jit_kernel(),
            signature,
            constants,
            arch=variant.arch,
            warps=triton_sampling.NUM_WARPS,
        )
    signature = {name: "*fp32" for name in ("part_max", "part_sum", "part_acc", "out")}
    signature["num_parts"] = "i32"
    constants = {"D": variant.d_head, "BLOCK_D": block_d, "CHUNK": triton_decode.COMBINE_CHUNK}
    return compile_kernel(combine, signature, constants, arch=variant.arch, warps=1)


def compile_kernel(
    fn: Any, signature: dict[str, str], constants: dict[str, Any], *, arch: int, warps: int
) -> Usage:
    """Compiles a jitted kernel `fn` for sm_`arch`: `signature` gives every runtime argument's Triton type
    ("*bf16", "i32"), `constants` the compile-time ones."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    signature = signature | {name: "constexpr" for name in constants}
    # Pointers 16-byte aligned, as torch allocates them (and as Triton specialises at launch).
    pointers = [i for i, name in enumerate(fn.arg_names) if signature[name].startswith("*")]
    attributes = {(i,): [["tt.divisibility", 16]] for i in pointers}
    compiled = triton.compile(
        ASTSource(fn, signature, constants, attributes),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": warps},
    )
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        # ptxas's verbose report, for the architecture Triton compiled for (the same tool, run again).
        done = subprocess.run(  # noqa: S603 - Triton's bundled ptxas with fixed arguments
            [
                get_ptxas(arch).path,
                "-v",
                "--regAllocOptLevel=2",
                f"--gpu-name=sm_{arch}{'a' if arch == 90 else ''}",
                str(source),
                "-o",
                str(Path(tmp) / "kernel.cubin"),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    log = done.stdout + done.stderr
    return Usage(
        registers=_number(r"Used (\d+) registers", log),
        spill_stores=_number(r"(\d+) bytes spill stores", log),
        spill_loads=_number(r"(\d+) bytes spill loads", log),
        stack=_number(r"(\d+) bytes stack frame", log),
        shared=int(compiled.metadata.shared),
        barriers=ptx.count("bar.sync"),
        warps=warps,
    )


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"ptxas reported no {pattern!r}:\n{text[-2000:]}")
    return int(found.group(1))
