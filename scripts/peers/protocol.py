"""The peer side of dslab's peer protocol (variants/peers/peer_process.h, README.md here): one JSON request a line on
stdin, one JSON reply a line back. A peer script gives its handlers; this module answers quit, output and unknown
requests the same way for every peer, and turns any exception into the one-line error dslab reports."""
import json
import os
import sys

import numpy as np


def serve(probe, prepare, run, output, replies=None):
    """Answers requests until quit or end of input. probe(msg) -> reply; prepare(msg) -> reply (or None: ok);
    run(msg) -> seconds; output() -> a numpy array, written as raw float32 to the request's path. replies: the file the
    replies go to (default stdout)."""
    replies = replies or sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        op = msg.get('op')
        try:
            if op == 'quit':
                break
            if op == 'probe':
                reply = probe(msg)
            elif op == 'prepare':
                reply = prepare(msg) or {'ok': True}
            elif op == 'run':
                reply = {'seconds': run(msg)}
            elif op == 'output':
                out = output()
                out.astype(np.float32).tofile(msg['path'])
                reply = {'ok': True, 'shape': list(out.shape)}
            else:
                reply = {'error': 'unknown op %r' % op}
        except Exception as e:  # (one line back to dslab: it reports it as the point's error)
            reply = {'error': '%s: %s' % (type(e).__name__, e)}
        replies.write(json.dumps(reply) + '\n')
        replies.flush()


def read_safetensors(path):
    """{name: numpy array in the file's own dtype (BF16 as uint16), memory-mapped}, metadata - without the safetensors
    package."""
    with open(path, 'rb') as f:
        n = int.from_bytes(f.read(8), 'little')
        header = json.loads(f.read(n))
    meta = header.pop('__metadata__', {})
    data = np.memmap(path, dtype=np.uint8, mode='r', offset=8 + n)
    types = {'BF16': np.uint16, 'F32': np.float32, 'F64': np.float64, 'I32': np.int32, 'I64': np.int64}
    out = {}
    for name, t in header.items():
        if t['dtype'] not in types:
            raise ValueError('%s: %s: dtype %s not expected' % (path, name, t['dtype']))
        lo, hi = t['data_offsets']
        out[name] = data[lo:hi].view(types[t['dtype']]).reshape(t['shape'])
    return out, meta


def bf16_to_float32(a):
    return (np.asarray(a, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def private_replies():
    """A descriptor of its own for the replies, with fd 1 sent to stderr: for a library that prints to the C
    library's stdout (kt-kernel does), which would otherwise corrupt the replies."""
    replies = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)
    return replies
