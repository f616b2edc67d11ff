#!/usr/bin/env python3
"""Page-loop instruction counts of the decode kernels in sm_90a cubins, without cuobjdump.

  python3 bench/cubin_loops.py A.cubin [B.cubin]

The machines without a GPU have nvcc and ptxas but no cuobjdump/nvdisasm, so this reads the
cubin's ELF sections directly: one 16-byte word per SASS instruction, the opcode in bits
0..11 (BRA = 0x947, HMMA = 0x23c), a BRA's signed offset in 4-byte words split over bits
16..23 (low byte) and 34..81 (the rest), relative to the next instruction. That decoding
was checked against cuobjdump on the H200 (docs/PERF.md): the three counts below equal
bench/sass_count.py's for every decode kernel.

Per kernel it prints the whole function's instructions and the three loops sass_count.py
reports: the "page loop" (the first backward branch whose body holds the most HMMAs; code
ptxas lays out inside it counts too), the smallest loop with as many HMMAs, and the
innermost loop with any HMMA. With two cubins (a base and a new build of the same
instantiation unit, e.g. `nvcc -cubin` of build/fp4kv/attention/instances/*.cu with the
flags in CMakeLists.txt) it pairs the kernels by template arguments and marks every count
that grew."""
import re
import struct
import sys

from sass_count import pick_page_loops, span_len

OP_BRA, OP_HMMA = 0x947, 0x23C


def text_sections(path):
    """{section name: bytes} of the .text.* sections of an ELF64 file."""
    with open(path, "rb") as f:
        d = f.read()
    shoff = struct.unpack_from("<Q", d, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    heads = [struct.unpack_from("<IIQQQQ", d, shoff + i * shentsize) for i in range(shnum)]
    strtab = heads[shstrndx][4]
    out = {}
    for name, _typ, _flags, _addr, off, size in heads:
        n = d[strtab + name : d.index(b"\0", strtab + name)].decode()
        if n.startswith(".text."):
            out[n[len(".text.") :]] = d[off : off + size]
    return out


def branch_target(i, word):
    """Instruction index a BRA at index i jumps to."""
    hi = (word >> 34) & ((1 << 48) - 1)
    if hi >> 47:
        hi -= 1 << 48
    words = (hi << 8) | ((word >> 16) & 0xFF)
    return i + 1 + words // 4


def loop_counts(code):
    ins = [int.from_bytes(code[i : i + 16], "little") for i in range(0, len(code), 16)]
    loops = []  # (HMMA count, first, last) of every backward branch with an MMA in its body
    for i, w in enumerate(ins):
        if w & 0xFFF == OP_BRA:
            t = branch_target(i, w)
            if t < i:
                h = sum(1 for x in ins[t : i + 1] if x & 0xFFF == OP_HMMA)
                if h:
                    loops.append((h, t, i))
    if not loops:
        return len(ins), None
    return len(ins), tuple(span_len(l) for l in pick_page_loops(loops))


def kernels(path):
    """{template arguments after the format: counts} of the decode kernels of a cubin."""
    out = {}
    for name, code in text_sections(path).items():
        m = re.search(r"decode_kernel.*?(ELi\d+ELi\d+ELi\d+E)", name)
        if m:
            fmt = re.search(r"decode_kernelI(?:NS1_)?(\w+?)ELi", name).group(1)
            out[(fmt.lstrip("0123456789"), m.group(1))] = loop_counts(code)
    return out


def main():
    if len(sys.argv) not in (2, 3):
        sys.exit(__doc__)
    a = kernels(sys.argv[1])
    if len(sys.argv) == 2:
        for k, (n, c) in sorted(a.items()):
            print(f"{k[0]} {k[1]}: whole {n}, page loop / tight / innermost {c}")
        return
    b = kernels(sys.argv[2])
    by_args = {k[1]: v for k, v in b.items()}
    for k, (n, c) in sorted(a.items()):
        if k[1] not in by_args:
            print(f"{k[0]} {k[1]}: not in {sys.argv[2]}")
            continue
        n2, c2 = by_args[k[1]]
        grew = [name for name, x, y in zip(("page loop", "tight", "innermost"), c or (), c2 or ()) if y > x]
        print(f"{k[1]}: whole {n} -> {n2}, loops {c} -> {c2}" + (f"  GREW: {', '.join(grew)}" if grew else ""))


if __name__ == "__main__":
    main()
