#!/usr/bin/env python3
"""Times builds of kernels/matmul_q8_mma.hip on an NVIDIA device, outside the engine.

A lab for tuning the int8 matrix-core product: each *variant* is a set of -D defines the kernel
file reads (MQ_WARPS, MQ_BT, MQ_K32, ...), compiled through CuPy's NVRTC as the engine compiles
it (sm_XX, -DWARP_SIZE=32, -DMMA_VARIANT=1). For each shape (Q4_K / Q6_K weights of random
blocks, random 8-bit activations) it runs every variant, checks its result against the first
variant's (the integer sums are exact, so only the order of f32 additions may differ), and
prints the median time over repetitions, and the weight bytes read per second.

Usage: q8_mma_lab.py KERNEL_DIR [--tokens 16,32,64] [--reps 50] [--variant NAME=-DA=1,-DB=2 ...]\n(a variant NAME=@old.hip,-DLAB_OLD_TILE builds an earlier file with its single tile shape).
Needs CuPy and a GPU; nothing in the engine calls it.
"""
import argparse
import sys

import cupy as cp
import numpy as np

FORMATS = {"q4_k": (12, 144, 256), "q6_k": (14, 210, 256), "q8_0": (8, 34, 32)}
SHAPES = [  # (name, format, rows, cols): the 8B shape's decode products
    ("gate/up 14336x4096", "q4_k", 14336, 4096),
    ("q/o 4096x4096", "q4_k", 4096, 4096),
    ("k/v 1024x4096", "q4_k", 1024, 4096),
    ("down 4096x14336", "q6_k", 4096, 14336),
]


def random_weights(rng, fmt, rows, cols):
    _, block, elems = FORMATS[fmt]
    n_blocks = rows * cols // elems
    raw = rng.integers(0, 256, size=(n_blocks, block), dtype=np.uint8)
    d = rng.uniform(1e-3, 1e-2, size=n_blocks).astype(np.float16).view(np.uint8).reshape(-1, 2)
    if fmt == "q4_k":
        raw[:, 0:2] = d
        raw[:, 2:4] = (rng.uniform(1e-3, 1e-2, size=n_blocks).astype(np.float16)
                       .view(np.uint8).reshape(-1, 2))
    elif fmt == "q6_k":
        raw[:, 208:210] = d
    else:
        raw[:, 0:2] = d
    return raw.reshape(-1)


def compile_variant(kernel_dir, source, defines, arch):
    options = ("-DWARP_SIZE=32", "-DMMA_VARIANT=1", f"-I{kernel_dir}", "-std=c++17",
               f"--gpu-architecture={arch}") + tuple(defines)
    return cp.RawModule(code=source, options=options, backend="nvrtc")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("kernel_dir")
    p.add_argument("--tokens", default="16,32,64")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--splits", default="auto", help="auto (the engine's rule), or a number")
    p.add_argument("--variant", action="append", default=[],
                   help="NAME=-DX=1,-DY=2 (the first is the reference)")
    p.add_argument("--shapes", default="all")
    p.add_argument("--no-default", action="store_true", help="leave the default build out")
    args = p.parse_args()
    variants = [] if args.no_default else [("default", [])]
    variants += [
        (v.split("=", 1)[0], [d for d in v.split("=", 1)[1].split(",") if d]) for v in args.variant
    ]
    source = open(f"{args.kernel_dir}/matmul_q8_mma.hip").read()
    dev = cp.cuda.Device()
    cc = dev.compute_capability
    sms = dev.attributes["MultiProcessorCount"]
    arch = f"sm_{cc}"
    modules = {}
    for index, (name, defines) in enumerate(variants):
        # A first item "@path" builds another source file (an earlier kernel, for comparison).
        code = source
        if defines and defines[0].startswith("@"):
            code = open(defines[0][1:]).read()
            defines = defines[1:]
            variants[index] = (name, defines)
        modules[name] = compile_variant(args.kernel_dir, code, defines, arch)
        k = modules[name].get_function("matmul_q8_mma_q4_k")
        print(f"# {name} {defines}: q4_k {k.num_regs} registers, {k.shared_size_bytes} B shared, "
              f"{k.local_size_bytes} B local", flush=True)
    reduce_mod = cp.RawKernel(r"""
extern "C" __global__ void reduce(const float* p, float* o, unsigned n, unsigned s) {
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float v = p[i];
        for (unsigned z = 1; z < s; ++z) v += p[(unsigned long long)z * n + i];
        o[i] = v;
    }
}""", "reduce")
    rng = np.random.default_rng(7)
    tokens_list = [int(t) for t in args.tokens.split(",")]
    print("| shape | tokens | variant | splits | µs (median) | weight GB/s | max rel diff |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for shape_name, fmt, rows, cols in SHAPES:
        if args.shapes != "all" and fmt not in args.shapes.split(","):
            continue
        w = cp.asarray(random_weights(rng, fmt, rows, cols))
        for n_tokens in tokens_list:
            xq = cp.asarray(rng.integers(-127, 128, size=n_tokens * cols, dtype=np.int8))
            xd = cp.asarray(rng.uniform(1e-3, 2e-2, size=n_tokens * cols // 32).astype(np.float32))
            reference = None
            for name, defines in variants:
                dmap = dict(d[2:].split("=", 1) if "=" in d else (d[2:], "1") for d in defines)
                old_tile = "LAB_OLD_TILE" in dmap
                br = 64
                threads = 128
                if old_tile:  # the kernel before 2026-12-07: one tile shape for every step
                    bt, bk, entry = 64, 256, f"matmul_q8_mma_{fmt}"
                else:  # ops::matmul_q8_mma's rule
                    bt = 32 if n_tokens <= 32 else 64
                    bk = 256 if fmt == "q6_k" else 128
                    entry = f"matmul_q8_mma_{'small_' if bt == 32 else ''}{fmt}"
                tiles = -(-rows // br) * -(-n_tokens // bt)
                steps = -(-cols // bk)
                if args.splits == "auto":
                    bpm = int(dmap.get("LAB_BLOCKS_PER_SM", 4))
                    wanted = -(-(sms * bpm) // tiles)
                    splits = min(wanted, steps // 2, 16)
                    splits = 1 if splits < 2 else -(-steps // -(-steps // splits))
                else:
                    splits = int(args.splits)
                k_split = -(-steps // splits) * bk
                splits = -(-cols // k_split)
                out = cp.zeros(n_tokens * rows, dtype=cp.float32)
                part = cp.zeros(n_tokens * rows * splits, dtype=cp.float32)
                f = modules[name].get_function(entry)
                grid = (-(-n_tokens // bt), -(-rows // br), splits)
                a = (w, xq, xd, part if splits > 1 else out, np.uint32(rows), np.uint32(cols),
                     np.uint32(n_tokens), np.uint32(k_split))

                def run():
                    f(grid, (threads,), a)
                    if splits > 1:
                        reduce_mod((264,), (256,), (part, out, np.uint32(n_tokens * rows),
                                                    np.uint32(splits)))
                for _ in range(5):
                    run()
                # Groups of back-to-back runs, so the host's launch time stays hidden.
                times = []
                start, end = cp.cuda.Event(), cp.cuda.Event()
                for _ in range(max(args.reps // 10, 3)):
                    start.record()
                    for _ in range(10):
                        run()
                    end.record()
                    end.synchronize()
                    times.append(cp.cuda.get_elapsed_time(start, end) * 100.0)
                us = float(np.median(times))
                result = out.get()
                if not np.all(np.isfinite(result)):
                    diff = float("nan")
                elif reference is None:
                    reference = result
                    diff = 0.0
                else:
                    scale = np.abs(reference).max()
                    diff = float(np.abs(result - reference).max() / scale)
                gbs = w.nbytes / us / 1e3
                print(f"| {shape_name} | {n_tokens} | {name} | {splits} | {us:.1f} | {gbs:.0f} | "
                      f"{diff:.2e} |", flush=True)


if __name__ == "__main__":
    sys.exit(main())
