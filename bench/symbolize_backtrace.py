"""Names the frames of a glibc backtrace (bench/segv_backtrace.c's output: lines like
`/path/lib.so(+0x1234)[0x7f...]` or `/path/lib.so(symbol+0x10)[0x7f...]`): addr2line for
what has debug information, else the nearest exported symbol below the offset (nm -D).
Usage: python3 bench/symbolize_backtrace.py CRASH_LOG"""
import bisect
import re
import subprocess
import sys

FRAME = re.compile(r"^(?P<path>/[^(\s]+)\((?P<sym>[^+)]*)\+0x(?P<off>[0-9a-f]+)\)")
_tables = {}


def exported(path):
    """Sorted (address, name) of the library's defined dynamic symbols."""
    if path not in _tables:
        out = subprocess.run(["nm", "-D", "--defined-only", "-C", path], capture_output=True, text=True).stdout
        rows = []
        for line in out.splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and parts[1] in "TtWi":
                rows.append((int(parts[0], 16), parts[2]))
        rows.sort()
        _tables[path] = rows
    return _tables[path]


def name(path, offset):
    r = subprocess.run(["addr2line", "-f", "-C", "-e", path, hex(offset)], capture_output=True, text=True)
    lines = r.stdout.splitlines()
    if lines and lines[0] != "??":
        return f"{lines[0]} ({lines[1] if len(lines) > 1 else '?'})"
    table = exported(path)
    i = bisect.bisect_right(table, (offset, "\uffff")) - 1
    return f"{table[i][1]} + {hex(offset - table[i][0])}" if i >= 0 else "??"


def main(log):
    for line in open(log, errors="replace"):
        m = FRAME.match(line.strip())
        if not m:
            continue
        path, sym, off = m["path"], m["sym"], int(m["off"], 16)
        where = f"{sym}+{hex(off)}" if sym else name(path, off)
        print(f"{path.rsplit('/', 1)[-1]:>28}  {where}")


if __name__ == "__main__":
    main(sys.argv[1])
