#!/usr/bin/env python3
"""The instruction mix of a CUDA kernel's hottest loop, from its SASS: a static count, with no GPU.

Each basic block of the kernel's largest loop (by instructions between a backward branch and its
target) with its instruction count and its most frequent opcodes; the tensor-core (HMMA), shared
fragment (LDSM), exponential (MUFU) and async-copy (LDGSTS) counts first. An SM sub-partition
issues one instruction a cycle, so the instructions a loop issues per HMMA bound how busy its
tensor cores can be; the blocks say where the rest go (masks only on edge tiles, copies, the
softmax). Which blocks run each iteration is the reader's to tell from the code.

    nvcc ... --generate-code=arch=compute_90,code=[sm_90] -c src/tensor/backend/cuda/attention_mma.cu -o A.o
    cuobjdump -sass A.o > A.sass
    python3 bench/sass_loop.py A.sass mma_forward_kernelILi64ELi2EtE

cuobjdump is not in this machine's CUDA toolkit; PyPI's nvidia-cuda-cuobjdump wheel carries it
(`pip download --no-deps nvidia-cuda-cuobjdump`, then unzip: nvidia/cu13/bin/cuobjdump).
"""
import collections
import re
import sys

INSTRUCTION = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z0-9_.]+)\s*([^;]*);")


def function_lines(lines, pattern):
    starts = [i for i, line in enumerate(lines) if "Function :" in line]
    for k, i in enumerate(starts):
        if re.search(pattern, lines[i]):
            return lines[i:starts[k + 1] if k + 1 < len(starts) else len(lines)]
    sys.exit(f"no function matching {pattern!r}")


def instructions(lines):
    out = []
    for line in lines:
        m = INSTRUCTION.search(line)
        if m:
            out.append((int(m.group(1), 16), m.group(3), m.group(4)))
    return out


def largest_loop(ins):
    index = {a: i for i, (a, _, _) in enumerate(ins)}
    best = None
    for i, (a, op, args) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < a and int(m.group(1), 16) in index:
            span = (index[int(m.group(1), 16)], i)
            if best is None or span[1] - span[0] > best[1] - best[0]:
                best = span
    if best is None:
        sys.exit("no loop found")
    return ins[best[0]:best[1] + 1]


def basic_blocks(loop):
    first, last = loop[0][0], loop[-1][0]
    leaders = {first}
    for i, (a, op, args) in enumerate(loop):
        if op.startswith(("BRA", "BSYNC", "EXIT")) and i + 1 < len(loop):
            leaders.add(loop[i + 1][0])
        m = re.search(r"0x([0-9a-f]+)", args) if op.startswith("BRA") else None
        if m and first <= int(m.group(1), 16) <= last:
            leaders.add(int(m.group(1), 16))
    blocks, current = [], []
    for item in loop:
        if item[0] in leaders and current:
            blocks.append(current)
            current = []
        current.append(item)
    blocks.append(current)
    return blocks


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    lines = open(sys.argv[1]).read().splitlines()
    loop = largest_loop(instructions(function_lines(lines, sys.argv[2])))
    total = collections.Counter(op.split(".")[0] for _, op, _ in loop)
    print(f"loop: {len(loop)} instructions, HMMA {total['HMMA']}, LDSM {total['LDSM']}, "
          f"MUFU {total['MUFU']}, LDGSTS {total['LDGSTS']}")
    for block in basic_blocks(loop):
        c = collections.Counter(op.split(".")[0] for _, op, _ in block)
        rest = ", ".join(f"{k} {v}" for k, v in c.most_common(6))
        print(f"  {block[0][0]:05x} {len(block):4d}: HMMA {c['HMMA']:3d} LDSM {c['LDSM']:2d} "
              f"MUFU {c['MUFU']:3d} LDGSTS {c['LDGSTS']:2d} | {rest}")


if __name__ == "__main__":
    main()
