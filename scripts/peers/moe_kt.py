#!/usr/bin/env python3
"""dslab's CPU MoE peer: KTransformers' own MoE kernels (kt-kernel, the pinned PyPI release the set-up fetches), driven
by dslab over stdin / stdout, one JSON object a line (variants/peers/peer_process.h, scripts/peers/README.md).

--method amx_bf16 / amx_int8: kt-kernel's AMXBF16_MOE / AMXInt8_MOE (the int8 one quantises the bf16 weights itself
when it loads them), from its AMX build; avx2_bf16: its AVX2BF16_MOE, the BF16 class it falls back to on a CPU
without AMX (from its AVX-512 build where the CPU has AVX512_BF16, else its AVX2 build).

The library: kt-kernel's extension modules are loaded straight from their files (the package's __init__ imports
torch, which this peer does not need): $DSLAB_KT_KERNEL_DIR, else the set-up's unpacked copy under
~/.cache/dslab/kt-kernel-<version>/ (kt_kernel/ and kt_kernel.libs/ as in the wheel).

Timing: one native call of the MoE object's forward (its worker pool computes; no Python task queue), timed by the
clock around it. The pool gets at most the CPU's cores less one: the calling thread waits on the pool by spinning, and
a pool as large as the machine leaves it waiting for the scheduler's next time slice (calls then take multiples of
~8 ms whatever their size)."""
import argparse
import importlib.util
import os
import sys
import time

import numpy as np

import protocol

KT_VERSION = '0.7.2'


def cpu_flags():
    try:
        with open('/proc/cpuinfo') as f:
            for line in f:
                if line.startswith('flags'):
                    return set(line.split(':', 1)[1].split())
    except OSError:
        pass
    return set()


def library_dir():
    d = os.environ.get('DSLAB_KT_KERNEL_DIR')
    if d:
        return d
    cache = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return os.path.join(cache, 'dslab', 'kt-kernel-' + KT_VERSION)


def extension_for(method):
    """(the extension's build name, the class) for a method, or raise RuntimeError with why it cannot run here."""
    flags = cpu_flags()
    if method.startswith('amx_'):
        if not {'amx_bf16', 'amx_tile'} <= flags or (method == 'amx_int8' and 'amx_int8' not in flags):
            raise RuntimeError('needs AMX (this CPU has no %s)' % ('amx_int8' if method == 'amx_int8' else 'amx_bf16'))
        return 'amx', 'AMXBF16_MOE' if method == 'amx_bf16' else 'AMXInt8_MOE'
    if 'avx2' not in flags:
        raise RuntimeError('needs AVX2')
    return ('avx512_bf16' if 'avx512_bf16' in flags else 'avx2'), 'AVX2BF16_MOE'


def load_extension(build):
    name = '_kt_kernel_ext_%s.cpython-%d%d-x86_64-linux-gnu.so' % (build, *sys.version_info[:2])
    path = os.path.join(library_dir(), 'kt_kernel', name)
    if not os.path.exists(path):
        raise RuntimeError('kt-kernel %s for CPython %d.%d is not there (%s; scripts/setup.sh fetches it for 3.11 '
                           'and 3.12)' % (KT_VERSION, *sys.version_info[:2], path))
    spec = importlib.util.spec_from_file_location('kt_kernel_ext', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class KtMoe:
    """One layer's routed experts in kt-kernel, rebuilt only when the experts file or the largest token count grows."""

    def __init__(self, method):
        self.method = method
        build, self.class_name = extension_for(method)
        self.ext = load_extension(build)
        self.key = None
        self.moe = None

    def load(self, experts_path, max_tokens, threads):
        key = (experts_path, os.path.getmtime(experts_path), threads)
        if self.moe is not None and key == self.key and max_tokens <= self.max_tokens:
            return
        t, meta = protocol.read_safetensors(experts_path)
        E, K = int(meta['experts']), int(meta['topk'])
        # kt-kernel reads stacked [experts][out][in] bf16 projections (nn.Linear's layout, one expert after another).
        self.gate = np.ascontiguousarray(np.stack([t['experts.%d.gate_proj.weight' % e] for e in range(E)]))
        self.up = np.ascontiguousarray(np.stack([t['experts.%d.up_proj.weight' % e] for e in range(E)]))
        self.down = np.ascontiguousarray(np.stack([t['experts.%d.down_proj.weight' % e] for e in range(E)]))
        I, H = self.gate.shape[1], self.gate.shape[2]
        self.hidden, self.topk = H, K
        self.moe = None
        self.pool = self.ext.CPUInfer(threads)
        config = self.ext.moe.MOEConfig(E, K, H, I)
        config.max_len = max(max_tokens, 1)
        config.pool = self.pool.backend_
        config.gate_proj, config.up_proj, config.down_proj = (self.gate.ctypes.data, self.up.ctypes.data,
                                                              self.down.ctypes.data)
        self.moe = getattr(self.ext.moe, self.class_name)(config)
        self.logical = np.arange(E, dtype=np.int64)  # physical expert e is logical expert e
        self.pool.submit(self.moe.load_weights_task(self.logical.ctypes.data))
        self.pool.sync()
        self.key, self.max_tokens, self.threads = key, max(max_tokens, 1), threads

    def prepare(self, inputs_path):
        t, _ = protocol.read_safetensors(inputs_path)
        self.x = np.array(t['hidden_states'], dtype=np.uint16)  # (copies: dslab rewrites the file)
        T, K = t['topk_idx'].shape
        if K != self.topk or self.x.shape[1] != self.hidden:
            raise ValueError('inputs of %d x %d / top-%d do not match the experts loaded (hidden %d, top-%d)' %
                             (T, self.x.shape[1], K, self.hidden, self.topk))
        self.ids = np.array(t['topk_idx'], dtype=np.int64)
        self.weights = np.array(t['topk_weight'], dtype=np.float32)
        self.out = np.zeros_like(self.x)
        self.tokens = np.array([T], dtype=np.int64)

    def run(self):
        start = time.perf_counter()
        self.moe.forward(self.tokens.ctypes.data, self.topk, self.ids.ctypes.data, self.weights.ctypes.data,
                         self.x.ctypes.data, self.out.ctypes.data, False)
        return time.perf_counter() - start

    def output(self):
        return protocol.bf16_to_float32(self.out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--method', choices=['amx_bf16', 'amx_int8', 'avx2_bf16'], required=True)
    a = ap.parse_args()
    replies = protocol.private_replies()  # (kt-kernel prints to the C library's stdout)
    peer = None

    def probe(msg):
        try:
            extension_for(a.method)
            KtMoe(a.method)
            return {'ok': True}
        except (RuntimeError, ImportError, OSError) as e:
            return {'skip': str(e)}

    def prepare(msg):
        nonlocal peer
        peer = peer or KtMoe(a.method)
        cores = os.cpu_count() or 1
        threads = max(1, min(int(msg.get('threads', cores)), cores - 1))
        peer.load(msg['experts'], int(msg['max_tokens']), threads)
        peer.prepare(msg['inputs'])
        return {'ok': True, 'threads': threads}

    protocol.serve(probe=probe, prepare=prepare, run=lambda msg: peer.run(), output=lambda: peer.output(),
                   replies=replies)


if __name__ == '__main__':
    main()
