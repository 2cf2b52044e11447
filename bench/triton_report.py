"""The Triton kernels (txl.kernels.triton: decoding attention, the fused decoding body, sampling) compiled ahead of
time for a GPU architecture, with no GPU present: Triton's own LLVM and the ptxas it ships. Reports what each
variant costs a GPU: registers, spills, shared memory, barriers (bench/gpu_kernels.py; tests/model checks every
variant compiles without spilling).

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

import torch
from txl.kernels.triton import attention as triton_attention
from txl.kernels.triton import decode as triton_decode
from txl.kernels.triton import embedding as triton_embedding
from txl.kernels.triton import layer_norm as triton_layer_norm
from txl.kernels.triton import rows_linear as triton_rows_linear
from txl.kernels.triton import sampling as triton_sampling
from txl.kernels.triton import softmax as triton_softmax
from txl.kernels.triton.common import FP_FUSION, next_power_of_2

_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Variant:
    """One compiled form of a kernel: the GPU architecture (80: A100, 90: H100) and the compile-time constants.

    Kernels: "partitions" and "combine" (the layer-by-layer path's decoding attention, `triton_decode`);
    "attention" (the fused decoding attention), "rows_linear" (a decoding step's linear layers with their
    LayerNorm), "layer_norm" (that LayerNorm's own launch, above a few rows), "embedding", "softmax_stats" and "softmax_write" (the adaptive softmax), "row_max",
    "nucleus_pass" and "draw" (sampling)."""

    kernel: str
    arch: int
    kv_dtype: str = "float32"  # the model's (the pool's) dtype; sampling reads float32 whatever it is
    d_head: int = 64
    block_size: int = 16
    split: bool = True
    rows: int = 1  # rows_linear: rows a step has (which tile of rows it compiles)
    linear: str = "ff_out"  # rows_linear: which of ROWS_LINEAR_CALLS

    def label(self) -> str:
        mode = "split" if self.split else "single pass"
        if self.kernel == "combine":
            return f"combine sm_{self.arch} d_head {self.d_head}"
        if self.kernel == "partitions":
            return f"partitions sm_{self.arch} {self.kv_dtype} d_head {self.d_head} bs {self.block_size} ({mode})"
        if self.kernel == "attention":
            return f"fused attention sm_{self.arch} {self.kv_dtype} d_head {self.d_head} ({mode})"
        if self.kernel == "rows_linear":
            return f"rows linear sm_{self.arch} {self.kv_dtype} {self.rows} rows ({self.linear.replace('_', ' ')})"
        if self.kernel in ("embedding", "softmax_stats", "softmax_write", "layer_norm"):
            return f"{self.kernel.replace('_', ' ')} sm_{self.arch} {self.kv_dtype}"
        return f"{self.kernel.replace('_', ' ')} sm_{self.arch}"


@dataclass(frozen=True)
class Usage:
    registers: int  # per thread
    spill_stores: int  # bytes
    spill_loads: int
    stack: int  # bytes of stack frame (local memory)
    shared: int  # bytes of shared memory per program
    barriers: int  # bar.sync instructions in the PTX
    warps: int
    narrow_loads: int = 0  # loads from global memory of 2 bytes or less, one number a thread (PTX)
    async_copies: int = 0  # asynchronous copies to shared memory (cp.async: a pipelined loop's loads)

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
    """The variants a server compiles: the layer-by-layer path's attention (float32 and bfloat16 pools at d_head
    64, wt103's, and 128; split and single pass; its combining kernel), the fused decoding body's kernels at the
    same shapes and at every tile of rows, and sampling's."""
    variants = []
    for arch in archs:
        for dtype in ("float32", "bfloat16"):
            for d_head in (64, 128):
                variants.append(Variant("partitions", arch, dtype, d_head))
                variants.append(Variant("attention", arch, dtype, d_head))
            for rows in (1, 16, 32, 64):
                variants.append(Variant("rows_linear", arch, dtype, rows=rows))
                variants.append(Variant("rows_linear", arch, dtype, rows=rows, linear="attention_out"))
            variants.append(Variant("layer_norm", arch, dtype))
            variants.append(Variant("embedding", arch, dtype))
            variants.append(Variant("softmax_stats", arch, dtype))
        variants.append(Variant("partitions", arch, "bfloat16", 64, split=False))
        variants.append(Variant("attention", arch, "bfloat16", 64, split=False))
        variants.append(Variant("rows_linear", arch, "bfloat16", linear="plain"))
        variants.append(Variant("combine", arch, "float32", 64))
        variants.append(Variant("softmax_write", arch, "bfloat16"))
        variants.extend(Variant(kernel, arch) for kernel in ("row_max", "nucleus_pass", "draw"))
    return variants


def compile_variant(variant: Variant) -> Usage:
    """Compiles `variant` for its architecture and reads ptxas's account of it."""
    compile_one = {
        "partitions": _partitions,
        "combine": _combine,
        "attention": _attention,
        "rows_linear": _rows_linear,
        "layer_norm": _layer_norm,
        "embedding": _embedding,
        "softmax_stats": _softmax_stats,
        "softmax_write": _softmax_write,
        "row_max": _row_max,
        "nucleus_pass": _nucleus_pass,
        "draw": _draw,
    }[variant.kernel]
    return compile_one(variant)


def _partitions(variant: Variant) -> Usage:
    partitions, _ = triton_decode.jit_kernels()
    kv = _DTYPES[variant.kv_dtype]
    signature = {name: "*fp32" for name in ("q", "bd", "part_max", "part_sum", "part_acc", "out")}
    signature |= {"keys": f"*{kv}", "values": f"*{kv}"}
    signature |= {name: "*i64" for name in ("table", "starts", "klens", "windows")}
    signature |= {n: "i32" for n in ("B", "H", "S", "NB", "P", "window_stride", "partition", "num_parts")}
    constants = {
        "D": variant.d_head,
        "BS": variant.block_size,
        "BLOCK_D": next_power_of_2(variant.d_head),
        "TILE": triton_decode.tile_keys(variant.d_head),
        "SPLIT": variant.split,
    }
    return compile_kernel(partitions, signature, constants, arch=variant.arch, warps=triton_decode.NUM_WARPS)


def _combine(variant: Variant) -> Usage:
    _, combine = triton_decode.jit_kernels()
    signature = {name: "*fp32" for name in ("part_max", "part_sum", "part_acc", "out")}
    signature["num_parts"] = "i32"
    block_d = next_power_of_2(variant.d_head)
    constants = {"D": variant.d_head, "BLOCK_D": block_d, "CHUNK": triton_decode.COMBINE_CHUNK}
    return compile_kernel(combine, signature, constants, arch=variant.arch, warps=1)


def _attention(variant: Variant) -> Usage:
    dtype = _DTYPES[variant.kv_dtype]
    signature = {name: f"*{dtype}" for name in ("qkv", "u", "v", "pos", "keys", "values", "out")}
    signature |= {n: "*i64" for n in ("table", "starts", "klens", "windows", "write_blocks", "write_slots")}
    signature |= {name: "*fp32" for name in ("part_max", "part_sum", "part_acc")}
    signature |= {"sem": "*i32", "scale": "fp32"}
    signature |= {n: "i32" for n in ("B", "S", "NB", "P", "P_TAB", "window_stride", "partition", "num_parts")}
    tile, warps = triton_attention.tile_and_warps(variant.d_head)
    constants = {
        "H": 16,
        "D": variant.d_head,
        "BS": variant.block_size,
        "BLOCK_D": next_power_of_2(variant.d_head),
        "TILE": tile,
        "SPLIT": variant.split,
        "STATS": triton_attention.COMBINE_STATS,
        "CHUNK": triton_attention.COMBINE_CHUNK,
    }
    return compile_kernel(triton_attention.jit_kernel(), signature, constants, arch=variant.arch, warps=warps)


# The row linears at wt103's shapes: (outputs, inputs, ReLU and bias on the input, bias, LayerNorm). The fused body
# launches the first two (txl.paged.gpu_decode); the plain product is the tests' and the kernel's other variant.
ROWS_LINEAR_CALLS = {
    "ff_out": (1024, 4096, True, True, True),  # the feed-forward's output, its residual and LayerNorm
    "attention_out": (1024, 1024, False, False, True),  # the attention's output projection, likewise
    "plain": (4096, 1024, False, False, False),
}


def rows_linear_constants(variant: Variant) -> dict[str, Any]:
    """The compile-time constants of `variant`: what `triton_rows_linear.rows_linear` launches for that call."""
    outputs, inputs, relu_input, bias, norm = ROWS_LINEAR_CALLS[variant.linear]
    plan = triton_rows_linear.plan_rows(rows=variant.rows, outputs=outputs, inputs=inputs, sms=132, norm=norm)
    dtype = getattr(torch, variant.kv_dtype)
    constants = triton_rows_linear.launch_constants(
        plan, variant.rows, outputs, dtype, relu_input=relu_input, bias=bias, norm=norm
    )
    return constants | {"WIDEN": False}  # compiled for a GPU, never widened as under the interpreter


def _rows_linear(variant: Variant) -> Usage:
    dtype = _DTYPES[variant.kv_dtype]
    names = ("x", "w", "in_bias", "bias", "residual", "norm_w", "norm_b", "out")
    signature = {name: f"*{dtype}" for name in names} | {"partial": "*fp32", "stats": "*fp32", "sem": "*i32"}
    signature |= {"eps": "fp32"} | {n: "i32" for n in ("M", "N", "K", "k_per_split", "splits")}
    return compile_kernel(
        triton_rows_linear.jit_kernel(),
        signature,
        rows_linear_constants(variant),
        arch=variant.arch,
        warps=triton_rows_linear.NUM_WARPS,
        stages=triton_rows_linear.NUM_STAGES,
        divisible=("N", "K", "k_per_split"),
    )


def _layer_norm(variant: Variant) -> Usage:
    """The LayerNorm's own launch after wt103's feed-forward output (1,024 columns), above IN_KERNEL_ROWS."""
    dtype = _DTYPES[variant.kv_dtype]
    signature = {"kept": "*fp32", "stats": "*fp32"} | {n: f"*{dtype}" for n in ("norm_w", "norm_b", "out")}
    signature |= {"M": "i32", "N": "i32", "tiles": "i32", "eps": "fp32"}
    plan = triton_rows_linear.plan_rows(rows=64, outputs=1024, inputs=4096, sms=132, norm=True)
    linear = triton_rows_linear.launch_constants(
        plan, 64, 1024, getattr(torch, variant.kv_dtype), relu_input=True, bias=True, norm=True
    )
    constants = {name: linear[name] for name in ("BLOCK_N", "TILES", "GROUP", "CHUNK_N")}
    return compile_kernel(
        triton_layer_norm.jit_kernel(),
        signature,
        constants,
        arch=variant.arch,
        warps=triton_rows_linear.NUM_WARPS,
        stages=triton_rows_linear.NUM_STAGES,
        divisible=("N", "tiles"),
    )


def _embedding(variant: Variant) -> Usage:
    dtype = _DTYPES[variant.kv_dtype]
    tables = ("e0", "e1", "e2", "e3", "p0", "p1", "p2", "p3", "out")
    signature = {"tokens": "*i64"} | {name: f"*{dtype}" for name in tables} | {"scale": "fp32"}
    signature |= {n: "i32" for n in ("lo1", "lo2", "lo3", "vocab")}
    constants = {  # wt103's clusters
        "D": 1024,
        "D0": 1024,
        "D1": 256,
        "D2": 64,
        "D3": 16,
        "CLUSTERS": 4,
        "BLOCK_N": triton_embedding.BLOCK_N,
        "BLOCK_E": triton_embedding.BLOCK_E,
    }
    return compile_kernel(
        triton_embedding.jit_kernel(),
        signature,
        constants,
        arch=variant.arch,
        warps=triton_embedding.NUM_WARPS,
    )


def _softmax_stats(variant: Variant) -> Usage:
    stats, _ = triton_softmax.jit_kernels()
    dtype = _DTYPES[variant.kv_dtype]
    signature = {name: f"*{dtype}" for name in ("x0", "x1", "x2", "x3", "clusters")}
    signature |= {name: "*fp32" for name in ("chunk_max", "chunk_sum", "shifts")} | {"sem": "*i32"}
    signature |= {n: "i32" for n in ("n0", "n1", "n2", "n3", "s1", "s2", "s3", "chunks")}
    constants = {
        "PARTS": 4,
        "CHUNK": triton_softmax.CHUNK,
        "BLOCK": triton_softmax.BLOCK,
        "STATS_BLOCK": triton_softmax.STATS_BLOCK,
    }
    return compile_kernel(stats, signature, constants, arch=variant.arch, warps=triton_softmax.NUM_WARPS)


def _softmax_write(variant: Variant) -> Usage:
    _, write = triton_softmax.jit_kernels()
    dtype = _DTYPES[variant.kv_dtype]
    signature = {name: f"*{dtype}" for name in ("x0", "x1", "x2", "x3")} | {"shifts": "*fp32", "out": "*fp32"}
    signature |= {n: "i32" for n in ("n0", "n1", "n2", "n3", "s1", "s2", "s3", "o1", "o2", "o3", "vocab")}
    constants = {"CHUNK": triton_softmax.CHUNK, "BLOCK": triton_softmax.BLOCK}
    return compile_kernel(write, signature, constants, arch=variant.arch, warps=triton_softmax.NUM_WARPS)


_SAMPLING = {"CHUNK": triton_sampling.CHUNK, "CHUNK_BLOCK": triton_sampling.CHUNK_BLOCK}


def _row_max(variant: Variant) -> Usage:
    row_max, _, _ = triton_sampling.jit_kernels()
    signature = {"lp": "*fp32", "chunk_best": "*fp32", "chunk_arg": "*i64", "sem": "*i32", "best": "*fp32"}
    signature |= {"best_at": "*i64", "V": "i32", "chunks": "i32"}
    constants = _SAMPLING | {"BLOCK": triton_sampling.BLOCK}
    return compile_kernel(row_max, signature, constants, arch=variant.arch, warps=triton_sampling.NUM_WARPS)


def _nucleus_pass(variant: Variant) -> Usage:
    _, nucleus_pass, _ = triton_sampling.jit_kernels()
    signature = {name: "*fp32" for name in ("lp", "best", "temperature", "top_p", "above", "total")}
    signature |= {"lo": "*i64", "hi": "*i64", "sem": "*i32", "V": "i32", "chunks": "i32"}
    constants = _SAMPLING | {"FIRST": False, "J": triton_sampling.PIVOTS, "BLOCK": triton_sampling.PASS_BLOCK}
    return compile_kernel(
        nucleus_pass, signature, constants, arch=variant.arch, warps=triton_sampling.NUM_WARPS
    )


def _draw(variant: Variant) -> Usage:
    _, _, draw = triton_sampling.jit_kernels()
    signature = {name: "*fp32" for name in ("lp", "best", "temperature", "kth", "chunk_sum", "logprobs")}
    signature |= {name: "*i64" for name in ("best_at", "top_k", "hi", "seeds", "counters", "tokens")}
    signature |= {"greedy": "*i1", "uniform": "*fp64", "readback": "*fp64", "sem": "*i32"}
    signature |= {n: "i32" for n in ("V", "chunks", "k_width")}
    flags = {"HAS_TOP_K": True, "HAS_TOP_P": True, "HAS_READBACK": True, "HAS_UNIFORM": False}
    constants = _SAMPLING | flags | {"BLOCK": triton_sampling.BLOCK}
    return compile_kernel(draw, signature, constants, arch=variant.arch, warps=triton_sampling.NUM_WARPS)


def compile_kernel(
    fn: Any,
    signature: dict[str, str],
    constants: dict[str, Any],
    *,
    arch: int,
    warps: int,
    stages: int = 3,
    divisible: tuple[str, ...] = (),
) -> Usage:
    """Compiles a jitted kernel `fn` for sm_`arch`: `signature` gives every runtime argument's Triton type
    ("*bf16", "i32"), `constants` the compile-time ones; `divisible`, the integers a launch passes divisible by 16
    (and does not mark `do_not_specialize`: Triton specialises on that, as on aligned pointers)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia.compiler import get_ptxas
    from triton.compiler import ASTSource

    signature = signature | {name: "constexpr" for name in constants}
    # Pointers 16-byte aligned, as torch allocates them, and integers divisible by 16 (as Triton specialises at
    # launch).
    aligned = [
        i for i, name in enumerate(fn.arg_names) if signature[name].startswith("*") or name in divisible
    ]
    attributes = {(i,): [["tt.divisibility", 16]] for i in aligned}
    compiled = triton.compile(
        ASTSource(fn, signature, constants, attributes),
        target=GPUTarget("cuda", arch, 32),
        options={"num_warps": warps, "num_stages": stages, "enable_fp_fusion": FP_FUSION},
    )
    ptx = compiled.asm["ptx"]
    with tempfile.TemporaryDirectory() as tmp:
        source = Path(tmp) / "kernel.ptx"
        source.write_text(ptx)
        # ptxas's verbose report, for the architecture Triton compiled for (the same tool, run again).
        done = subprocess.run(
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
        narrow_loads=len(re.findall(r"ld\.global(?:\.[a-z]+)*\.(?:b16|b8|u8|s8|u16|s16)\b", ptx)),
        async_copies=ptx.count("cp.async.cg") + ptx.count("cp.async.ca"),
    )


def _number(pattern: str, text: str) -> int:
    found = re.search(pattern, text)
    if found is None:
        raise RuntimeError(f"ptxas reported no {pattern!r}:\n{text[-2000:]}")
    return int(found.group(1))
