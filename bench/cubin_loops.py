#!/usr/bin/env python3
"""Page-loop instruction counts of the decode kernels in sm_90a cubins, without cuobjdump.

  python3 bench/cubin_loops.py A.cubin [B.cubin]

The machines without a GPU have nvcc and ptxas but no cuobjdump/nvdisasm, so this reads the
cubin's ELF sections directly: one 16-byte word per SASS instruction, the opcode in bits
0..11 (BRA = 0x947, HMMA = 0x23c), a BRA's signed offset in 4-byte words split over bits
16..23 (low byte) and 34..81 (the rest), relative to the next instruction. That decoding
was checked against cuobjdump on the H200 (docs/PERF.md): the three counts below equal
bench/sass_count.py's for every decode kernel.

  python3 bench/cubin_loops.py --hist A.cubin

Per kernel it prints the whole function's instructions and the three loops sass_count.py
reports, counting page MMAs only (FP16 in FP4 and FP8 kernels, whose BF16 MMAs are the
sink/recent CTA's): the "page loop" (the first backward branch whose body holds the most; code
ptxas lays out inside it counts too), the smallest loop with as many HMMAs, and the
innermost loop with any HMMA (mixed-mode kernels with page-pair tiles, softmax_state.cuh
kPagePairs, run two pages per iteration: halve their counts for a page). With two cubins (a
base and a new build of the same instantiation unit, e.g. `nvcc -cubin` of
build/fp4kv/attention/instances/*.cu with the flags in CMakeLists.txt) it pairs the kernels by
template arguments and marks every count that grew. With --hist, the opcode histogram of each
kernel's innermost MMA loop.

  python3 bench/cubin_loops.py --sass CUOBJDUMP A.cubin [NAME-PART]

The innermost MMA loop's disassembly of each decode kernel (whose mangled name contains
NAME-PART), by a CUDA 11.8 `cuobjdump`: the one in Debian's `nvidia-cuda-toolkit` (component
non-free, added to apt's sources: `apt-get download nvidia-cuda-toolkit && dpkg -x
nvidia-cuda-toolkit_*.deb x`, then x/usr/bin/cuobjdump; nothing else of it is needed). It
predates the ELF header that CUDA 12 writes, so it reads a copy of the cubin with the old
header (OS ABI 0x33, ABI version 7, flags for sm_90 with 64-bit addresses); sm_90a's
instruction words are sm_90's (each listed opcode is the one this script decodes), and the
few opcodes newer than 11.8 (VIADD) are printed by mnemonic, without operands."""
import re
import struct
import subprocess
import sys
import tempfile
from collections import Counter

from sass_count import page_mmas_are_bf16, pick_page_loops, span_len

OP_BRA, OP_HMMA = 0x947, 0x23C
# Mnemonics of the opcodes (bits 0..11) the decode kernels' page loops use, read off
# `cuobjdump --dump-sass` of sm_90a decode kernels on the H200 (2026-12-03: 93 opcodes, each
# mapping to one mnemonic); --hist prints a loop's histogram with them, hex for any other.
OPCODE_NAMES = {
    0x202: "MOV", 0x207: "SEL", 0x208: "FSEL", 0x209: "FMNMX", 0x20B: "FSETP", 0x20C: "ISETP",
    0x210: "IADD3", 0x211: "LEA", 0x212: "LOP3", 0x219: "SHF", 0x220: "FMUL", 0x221: "FADD",
    0x223: "FFMA", 0x224: "IMAD", 0x225: "IMAD", 0x232: "HMUL2", 0x23C: "HMMA", 0x23E: "F2FP",
    0x245: "I2FP", 0x291: "ULEA", 0x2CA: "R2UR", 0x300: "FLO", 0x302: "FCHK", 0x305: "F2I",
    0x306: "I2F", 0x308: "MUFU", 0x348: "WARPSYNC", 0x388: "STS", 0x389: "SHFL", 0x3BA: "UBLKCP",
    0x421: "FADD", 0x423: "FFMA", 0x424: "IMAD", 0x5A7: "SYNCS", 0x802: "MOV", 0x804: "R2P",
    0x805: "CS2R", 0x806: "VOTE", 0x807: "SEL", 0x808: "FSEL", 0x809: "FMNMX", 0x80B: "FSETP",
    0x80C: "ISETP", 0x810: "IADD3", 0x811: "LEA", 0x812: "LOP3", 0x816: "PRMT", 0x819: "SHF",
    0x81C: "PLOP3", 0x820: "FMUL", 0x823: "FFMA", 0x824: "IMAD", 0x825: "IMAD", 0x827: "IMAD",
    0x82F: "ELECT", 0x836: "VIADD", 0x83B: "LDSM", 0x848: "VIMNMX", 0x882: "UMOV", 0x890: "UIADD3",
    0x899: "USHF", 0x8A4: "UIMAD", 0x902: "FCHK", 0x918: "NOP", 0x919: "S2R", 0x91A: "DEPBAR",
    0x91B: "ENDCOLLECTIVE", 0x941: "BSYNC", 0x944: "CALL", 0x945: "BSSY", 0x947: "BRA",
    0x948: "WARPSYNC", 0x94D: "EXIT", 0x981: "LDG", 0x984: "LDS", 0x986: "STG", 0x9A7: "SYNCS",
    0x9C3: "S2UR", 0xAB9: "ULDC", 0xB1D: "BAR", 0xB82: "LDC", 0xC02: "MOV", 0xC0C: "ISETP",
    0xC10: "IADD3", 0xC11: "LEA", 0xC20: "FMUL", 0xC24: "IMAD", 0xC25: "IMAD", 0xC36: "VIADD",
    0xC82: "UMOV", 0xE21: "FADD", 0xE24: "IMAD", 0xF89: "SHFL",
}


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


def instructions(code):
    """The 128-bit instruction words of a .text section."""
    return [int.from_bytes(code[i : i + 16], "little") for i in range(0, len(code), 16)]


def is_bf16_hmma(word):
    """An HMMA with BF16 operands (bit 82 of the word; checked against cuobjdump's .BF16)."""
    return (word >> 82) & 1 == 1


def page_mmas(ins):
    """Predicate for the page loop's MMAs (sass_count.page_mmas_are_bf16)."""
    want_bf16 = page_mmas_are_bf16(is_bf16_hmma(w) for w in ins if w & 0xFFF == OP_HMMA)
    return lambda w: w & 0xFFF == OP_HMMA and is_bf16_hmma(w) == want_bf16


def mma_loops(ins):
    """(HMMA count, first, last) of every backward branch with a page MMA in its body."""
    loops = []
    is_page_mma = page_mmas(ins)
    for i, w in enumerate(ins):
        if w & 0xFFF == OP_BRA:
            t = branch_target(i, w)
            if t < i:
                h = sum(1 for x in ins[t : i + 1] if is_page_mma(x))
                if h:
                    loops.append((h, t, i))
    return loops


def loop_counts(code):
    ins = instructions(code)
    loops = mma_loops(ins)
    if not loops:
        return len(ins), None
    return len(ins), tuple(span_len(l) for l in pick_page_loops(loops))


def innermost_loop(ins):
    """(first, last) instruction index of the innermost loop with an MMA, or None."""
    loops = mma_loops(ins)
    if not loops:
        return None
    _, first, last = pick_page_loops(loops)[2]
    return first, last


def mnemonic(word):
    return OPCODE_NAMES.get(word & 0xFFF, f"0x{word & 0xFFF:03X}")


def innermost_hist(code):
    """Opcode histogram of the innermost loop with an MMA (mnemonics from OPCODE_NAMES)."""
    ins = instructions(code)
    if not (loop := innermost_loop(ins)):
        return None
    return Counter(mnemonic(x) for x in ins[loop[0] : loop[1] + 1])


# The pre-CUDA-12 cubin header that CUDA 11.8's cuobjdump reads: OS ABI, ABI version, and
# e_flags = EF_CUDA_VIRTUAL_SM(90) | EF_CUDA_64BIT_ADDRESS | EF_CUDA_SM90.
OLD_OSABI, OLD_ABI_VERSION, OLD_SM90_FLAGS = 0x33, 7, 0x005A055A


def with_old_header(path, out):
    """Writes the cubin at `path` to the open file `out` with the pre-CUDA-12 header."""
    d = bytearray(open(path, "rb").read())
    d[7], d[8] = OLD_OSABI, OLD_ABI_VERSION
    struct.pack_into("<I", d, 0x30, OLD_SM90_FLAGS)
    out.write(d)
    out.flush()


def print_loop_sass(cuobjdump, path, name_part):
    """The innermost MMA loop of each matching decode kernel, as cuobjdump lists it."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as old:
        with_old_header(path, old)
        for name, code in sorted(text_sections(path).items()):
            ins = instructions(code)
            if "decode_kernel" not in name or name_part not in name or not (loop := innermost_loop(ins)):
                continue
            first, last = loop
            listing = subprocess.run([cuobjdump, "-sass", "-fun", name, old.name], capture_output=True,
                                     text=True, check=True).stdout
            text = {}
            for line in listing.splitlines():
                if m := re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*(/\*.*)?$", line):
                    text[int(m.group(1), 16) // 16] = m.group(2)
            print(f"{name}: innermost MMA loop, {last - first + 1} instructions")
            for i in range(first, last + 1):
                listed = text.get(i) or f"{mnemonic(ins[i])} (operands not decoded by this cuobjdump)"
                print(f"  {16 * i:04x}  {listed}")


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
    if len(sys.argv) == 3 and sys.argv[1] == "--hist":
        for name, code in sorted(text_sections(sys.argv[2]).items()):
            if "decode_kernel" in name and (h := innermost_hist(code)):
                print(f"{name}: {sum(h.values())} instructions")
                print("  " + ", ".join(f"{k} {v}" for k, v in h.most_common()))
        return
    if len(sys.argv) in (4, 5) and sys.argv[1] == "--sass":
        print_loop_sass(sys.argv[2], sys.argv[3], sys.argv[4] if len(sys.argv) == 5 else "")
        return
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
