#!/usr/bin/env python3
"""Disassembles every cubin of a kdtree cache directory into one file per grid point.

    tools/sass_snapshot.py CACHE_DIR OUT_DIR

A cache entry (cache/disk_cache.cpp) is <readable>-<hash16>.kdc: a header
{"KDTC", u32 format version, u64 payload size, payload SHA-256, key SHA-256}
and a payload {"KDMD", u32 log bytes, ptxas log, cubin} (runtime/runtime.cpp).
The hash covers the rendered source, so it changes with any source edit; the
readable part (op, shape, dtype, arch) names the grid point and is what two
snapshots are compared by.

OUT_DIR/<readable>.<function>.sass holds the normalised disassembly of each
kernel of the entry, OUT_DIR/<readable>.<function>.res its ptxas resource lines
(registers, spills, shared memory), OUT_DIR/<readable>.head the module's other
sections. Normalisation drops what does not change the code: the disassembler's
header lines, trailing whitespace and the module-wide numbering of branch labels
(renumbered per function), so a kernel added to or removed from a module shows as
that file alone. nvdisasm is searched in
$NVDISASM, PATH, the CUDA toolkit and the pip wheels (nvidia-cuda-nvdisasm,
triton's bundled copy).
"""
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

# Entry format 2 (cache/disk_cache.cpp): magic "KDTC", format u32, payload size u64,
# version-tag size u32, checksum[32], key hash[32], then the tag, then the payload.
HEADER = 4 + 4 + 8 + 4 + 32 + 32
FORMAT = 2


def find_nvdisasm():
    candidates = [os.environ.get("NVDISASM", ""), shutil.which("nvdisasm") or ""]
    cuda = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates.append(os.path.join(cuda, "bin", "nvdisasm"))
    for site in sys.path:
        candidates += glob.glob(os.path.join(site, "nvidia", "*", "bin", "nvdisasm"))
        candidates += glob.glob(os.path.join(site, "nvidia", "cuda_nvdisasm", "bin", "nvdisasm"))
        candidates += glob.glob(os.path.join(site, "triton", "backends", "nvidia", "bin", "nvdisasm"))
    for c in candidates:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    sys.exit("sass_snapshot: nvdisasm not found (pip install nvidia-cuda-nvdisasm, or set NVDISASM)")


def read_entry(path):
    data = open(path, "rb").read()
    if len(data) < HEADER or data[:4] != b"KDTC":
        raise ValueError(f"{path}: not a kdtree cache entry")
    (fmt,) = struct.unpack_from("<I", data, 4)
    if fmt != FORMAT:
        raise ValueError(f"{path}: entry format {fmt}, this reader knows {FORMAT}")
    (size,) = struct.unpack_from("<Q", data, 8)
    (tag_size,) = struct.unpack_from("<I", data, 16)
    payload = data[HEADER + tag_size:]
    if len(payload) != size or payload[:4] != b"KDMD":
        raise ValueError(f"{path}: malformed payload")
    (log_bytes,) = struct.unpack_from("<I", payload, 4)
    log = payload[8:8 + log_bytes].decode("utf-8", "replace")
    cubin = payload[8 + log_bytes:]
    return log, cubin


def resource_lines(log):
    keep = []
    for line in log.splitlines():
        if re.search(r"Compiling entry|Function properties|bytes stack frame|Used \d+ registers", line):
            keep.append(re.sub(r"\s+", " ", line.strip()))
    return "\n".join(keep) + "\n"


def normalise(sass):
    out = []
    for line in sass.splitlines():
        line = line.rstrip()
        if line.startswith("//") and ("nvdisasm" in line or "Generated" in line):
            continue
        out.append(line)
    return "\n".join(out) + "\n"


# A function starts at nvdisasm's banner comment before its text section (or at
# the section line itself).
SECTION = re.compile(r"^(?://-+ \.text\.([A-Za-z0-9_]+) -+|\s*\.section\s+\.text\.([A-Za-z0-9_]+),)")
INTERNAL = re.compile(r"\$__internal_\d+_\$")
LABEL = re.compile(r"\.L_x_\d+")


def split_functions(sass):
    """The disassembly split into the module's head (sections other than code) and
    one text per kernel function, {name: text}. Branch labels are renumbered in the
    order they appear within each function: nvdisasm numbers them across the
    module, so removing one function (a combine kernel the module no longer holds)
    would otherwise renumber the labels of every other function."""
    head, functions, name = [], {}, None
    for line in sass.splitlines():
        m = SECTION.match(line)
        if m and (m.group(1) or m.group(2)) != name:
            name = m.group(1) or m.group(2)
            functions[name] = []
        (functions[name] if name else head).append(line)
    for fn, lines in functions.items():
        numbers = {}
        text = INTERNAL.sub("$__internal_$", "\n".join(lines))  # numbered across the module too
        functions[fn] = LABEL.sub(lambda m: numbers.setdefault(m.group(0), f".L_x_{len(numbers)}"), text) + "\n"
    return "\n".join(head) + "\n", functions


def split_resources(res):
    """The resource lines per kernel function, {name: text}."""
    functions, name = {}, None
    for line in res.splitlines():
        m = re.search(r"Compiling entry function '([A-Za-z0-9_]+)'", line)
        if m:
            name = m.group(1)
        functions.setdefault(name, []).append(line)
    return {fn: "\n".join(lines) + "\n" for fn, lines in functions.items()}


def write_snapshot(out_dir, readable, sass, res):
    """OUT/<entry>.head (the module's other sections), and per kernel function
    OUT/<entry>.<function>.sass and .res."""
    head, functions = split_functions(normalise(sass))
    with open(os.path.join(out_dir, readable + ".head"), "w") as f:
        f.write(LABEL.sub(".L_x", head))
    for fn, text in functions.items():
        with open(os.path.join(out_dir, f"{readable}.{fn}.sass"), "w") as f:
            f.write(text)
    for fn, text in split_resources(res).items():
        with open(os.path.join(out_dir, f"{readable}.{fn or 'module'}.res"), "w") as f:
            f.write(text)


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    cache_dir, out_dir = sys.argv[1], sys.argv[2]
    nvdisasm = find_nvdisasm()
    os.makedirs(out_dir, exist_ok=True)
    entries = sorted(glob.glob(os.path.join(cache_dir, "*.kdc")))
    if not entries:
        sys.exit(f"sass_snapshot: no *.kdc entries in {cache_dir}")
    seen = set()
    for path in entries:
        readable = re.sub(r"-[0-9a-f]{16}\.kdc$", "", os.path.basename(path))
        if readable in seen:
            sys.exit(f"sass_snapshot: two entries for {readable} in {cache_dir}: clear the cache first")
        seen.add(readable)
        log, cubin = read_entry(path)
        with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
            f.write(cubin)
            f.flush()
            sass = subprocess.run([nvdisasm, "-c", f.name], check=True, capture_output=True, text=True).stdout
        write_snapshot(out_dir, readable, sass, resource_lines(log))
    print(f"sass_snapshot: {len(entries)} entries from {cache_dir} -> {out_dir} ({nvdisasm})")


if __name__ == "__main__":
    main()
