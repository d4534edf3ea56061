#!/usr/bin/env python3
"""Checks on the machine code (SASS) of the fused MLA decode kernels that no CPU test can see otherwise.

usage: scripts/check_sass.py [--nvdisasm PATH] OBJECT.o ...

Each object's sm_90a cubin is taken from its fatbin (section .nv_fatbin) and disassembled with nvdisasm (the
nvidia-cuda-nvdisasm wheel of scripts/requirements.txt, or one on PATH / in the CUDA toolkit). Objects of units
without rules are ignored. Exit 0: every rule holds; 1: one fails (each rule prints one line); 77: nothing to check
(no nvdisasm, or no object of a unit with rules) - ctest reports it skipped.

Why these rules: a few lines of bookkeeping added outside the two-warpgroup kernel's loop moved its Q K^T descriptors
out of the uniform registers (10-12 instructions between its 32-cycle MMAs instead of 3-4) and made every block 8-10%
slower on the H100 - with the same MMAs, barriers and a clean build. And a
kernel whose MMAs ptxas serialised (one accumulator read on a path it could not prove waited: C7514, only an info line
in the build's output) ran at 3.7 us a block against 2.2 once mended: a finding that was taken for the
design's limit.
"""
import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile


def find_nvdisasm(explicit):
    if explicit:
        return explicit
    here = shutil.which('nvdisasm')
    if here:
        return here
    wheel_bin = os.path.join('lib', 'python3*', 'site-packages', 'nvidia', 'cu*', 'bin', 'nvdisasm')
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    candidates = glob.glob(os.path.join(sys.prefix, wheel_bin)) + glob.glob(os.path.join(repo, '.venv', wheel_bin))
    candidates += ['/usr/local/cuda/bin/nvdisasm']
    return next((c for c in candidates if os.access(c, os.X_OK)), None)


def elf_sections(data):
    """(name, offset, size) of a 64-bit little-endian ELF's sections that occupy bytes in the file."""
    shoff, = struct.unpack_from('<Q', data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from('<HHH', data, 0x3A)
    headers = [struct.unpack_from('<IIQQQQIIQQ', data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    nobits = 8  # SHT_NOBITS: a size, no bytes (shared memory, zeroed globals)
    return [(names[h[0]:names.index(b'\0', h[0])].decode(), h[4], h[5]) for h in headers if h[1] != nobits]


def cubins_in(object_path):
    """The cubins (ELF images) inside an object's .nv_fatbin; none where they are compressed. A fatbin: a 16-byte
    header (magic 0xBA55ED50, version, header size, size of what follows), then entries of a header (kind: 2 = ELF,
    its header's size, its payload's size, ...) and a payload."""
    data = open(object_path, 'rb').read()
    fatbin = next((data[off:off + size] for name, off, size in elf_sections(data) if name == '.nv_fatbin'), b'')
    found, at = [], 0
    while at + 16 <= len(fatbin):
        magic, _, header_size, size = struct.unpack_from('<IHHQ', fatbin, at)
        if magic != 0xBA55ED50:
            break
        entry, end = at + header_size, at + header_size + size
        while entry + 16 <= end:
            kind, _, entry_header, payload = struct.unpack_from('<HHIQ', fatbin, entry)
            image = fatbin[entry + entry_header:entry + entry_header + payload]
            if kind == 2 and image.startswith(b'\x7fELF'):
                found.append(image)
            entry += entry_header + payload
        at = (end + 7) // 8 * 8
    return found


def functions(sass):
    """{mangled kernel name: [(address, instruction)]} from `nvdisasm -c` text, with {label: address}."""
    kernels, labels, current, pending = {}, {}, None, []
    for line in sass.splitlines():
        m = re.match(r'\s*\.section\s+\.text\.(\S+)', line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r'^\s*\.(L_x_\d+):', line)
        if m:
            pending.append(m.group(1))
            continue
        m = re.match(r'^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;', line)
        if m and current is not None:
            address = int(m.group(1), 16)
            for label in pending:
                labels[label] = address
            pending = []
            current.append((address, m.group(2)))
    return kernels, labels


def innermost_loop(code, labels, opcode, at_least):
    """The shortest backward-branch range holding at least `at_least` `opcode` instructions: (first, last) indices."""
    best = None
    for i, (address, ins) in enumerate(code):
        m = re.search(r'BRA\s+`\(\.(L_x_\d+)\)', ins)
        target = labels.get(m.group(1)) if m else None
        if target is None or target >= address:
            continue
        first = next(j for j, (a, _) in enumerate(code) if a >= target)
        if sum(1 for _, x in code[first:i + 1] if x.startswith(opcode)) >= at_least and (best is None or i - first < best[1] - best[0]):
            best = (first, i)
    return best


def rule_uniform_qk_descriptors(code, labels):
    """The two-warpgroup kernel's pairs' loop: consecutive Q K^T MMAs (no wait or barrier between) take their
    descriptors from uniform registers - no R2UR between them."""
    qk = 'HGMMA.64x64x16'
    loop = innermost_loop(code, labels, qk, 72)  # two blocks' 36 Q K^T MMAs: the loop over pairs
    if loop is None:
        return False, 'no loop with two blocks of Q K^T MMAs (HGMMA.64x64x16) found'
    body = [x for _, x in code[loop[0]:loop[1] + 1]]
    at = [i for i, x in enumerate(body) if x.startswith(qk)]
    back_to_back = moved = 0
    for a, b in zip(at, at[1:]):
        between = body[a + 1:b]
        if any(x.startswith(('SYNCS', 'BAR', 'WARPSYNC')) or 'BRA' in x for x in between):
            continue
        back_to_back += 1
        moved += any(x.startswith('R2UR') for x in between)
    return moved == 0, f'{moved} of {back_to_back} back-to-back Q K^T MMAs in the pairs\' loop wait for an R2UR (want 0)'


def rule_no_local_memory(code, labels):
    """No spill: no local-memory loads or stores anywhere in the kernel."""
    local = sum(1 for _, x in code if re.match(r'(@!?U?P\w+\s+)?(STL|LDL)\b', x))
    return local == 0, f'{local} local-memory loads/stores (want 0: registers spilled)'


def rule_mmas_pipelined(code, labels):
    """The warpgroup MMAs are not serialised: where ptxas cannot keep them in flight (C7511 / C7512 / C7514: an
    accumulator read between an MMA and its wait, too few registers) every HGMMA carries its own group's scoreboard
    (gsb0) and is followed by a wait for it; the kernels' commit groups hold 4 MMAs or more, so most carry none."""
    mmas = [x for _, x in code if x.startswith('HGMMA')]
    if not mmas:
        return False, 'no HGMMA in the kernel (the rule is for kernels built on warpgroup MMAs: is the pattern right?)'
    own_wait = sum(1 for x in mmas if x.rstrip().endswith('gsb0'))
    return 2 * own_wait < len(mmas), f'{own_wait} of {len(mmas)} HGMMAs each close their own group (want under half: not serialised)'


# (unit's object name, or its path's tail where two units share a name; kernel name pattern; rules)
RULES = [
    ('sm90_bf16_h128.cu.o', r'seesaw13decode_kernel', [rule_uniform_qk_descriptors, rule_no_local_memory, rule_mmas_pipelined]),
    ('sm90_fp8_h16.cu.o', r'fp813decode_kernel', [rule_no_local_memory, rule_mmas_pipelined]),
    ('sm90_bf16_h16.cu.o', r'decode_kernel', [rule_mmas_pipelined]),
    ('sm90_int8_h16.cu.o', r'decode_kernel', [rule_mmas_pipelined]),
    # the MoE combine with the residual add and next norm fused in: a token's sums stay in registers across the norm
    ('moe/cuda/op.cu.o', r'combine_add_norm_kernel', [rule_no_local_memory]),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    parser.add_argument('--nvdisasm', help="nvdisasm to use (default: PATH, the wheel in this Python or in the repository's .venv, the CUDA toolkit)")
    parser.add_argument('objects', nargs='*', help="object files (the build's dslab_variants objects)")
    args = parser.parse_args()
    nvdisasm = find_nvdisasm(args.nvdisasm)
    if nvdisasm is None:
        print('nvdisasm not found (pip-installed by scripts/setup.sh from scripts/requirements.txt): skipped')
        return 77
    checked, failed = 0, 0
    for unit, kernel_pattern, rules in RULES:
        objects = [o for o in args.objects if o.replace(os.sep, '/').endswith('/' + unit) or o == unit]
        for obj in objects:
            images = cubins_in(obj)
            if not images:
                print(f'{obj}: no uncompressed cubin in its fatbin: skipped')
                continue
            for image in images:
                with tempfile.NamedTemporaryFile(suffix='.cubin') as f:
                    f.write(image)
                    f.flush()
                    sass = subprocess.run([nvdisasm, '-c', f.name], check=True, capture_output=True, text=True).stdout
                kernels, labels = functions(sass)
                matched = [k for k in kernels if re.search(kernel_pattern, k)]
                if not matched:
                    print(f'FAIL {unit}: no kernel matching {kernel_pattern}')
                    failed += 1
                for name in matched:
                    for rule in rules:
                        ok, detail = rule(kernels[name], labels)
                        print(f"{'ok  ' if ok else 'FAIL'} {unit} {rule.__name__[5:]}: {detail}")
                        checked += 1
                        failed += not ok
    if checked == 0 and failed == 0:
        print('no object of a unit with rules given: skipped')
        return 77
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
