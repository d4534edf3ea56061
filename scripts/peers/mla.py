#!/usr/bin/env python3
"""dslab's MLA peers, driven by dslab over stdin / stdout, one JSON object a line (variants/peers/peer_process.h).

--backend torch: the four forms as the seed's PyTorch benchmark structures them, one module call a step in bf16 (fp32
softmax), on the CPU or a CUDA device: CacheDecompressed (cd: the cached keys' K/V decompressed once, at prepare,
the new tokens' each step), CacheCompressed (cc: the latent cache decompressed every step), Absorbed (a_cc: W_UK
folded into the query, one score over the concatenated [latent | rope key]) and Absorbed + MoveElision (a_cc_me: the
rope and latent scores summed apart, no concatenation). --backend numpy: a_cc_me in float32 einsums (no PyTorch needed).

Every step reads the same inputs: the weights, hidden states and cache dslab wrote (a safetensors file), the new tokens'
keys written into their slots of a preallocated cache (as a serving engine writes them), causal among the new tokens,
RoPE as the matrices dslab gives for each new token's position. A step is timed by the peer itself (CUDA events, or the
clock on the CPU), after an L2 / cache flush when asked."""
import argparse
import time

import numpy as np

import protocol


class Problem:
    """The inputs, as float32 numpy arrays, and the dims."""

    def __init__(self, path):
        t, meta = protocol.read_safetensors(path)
        t = {k: (protocol.bf16_to_float32(v) if v.dtype == np.uint16 else np.array(v, dtype=np.float32))
             for k, v in t.items()}
        self.t = t
        self.heads = int(meta['heads'])
        self.eps = float(meta['rms_norm_eps'])
        self.nope, self.rope, self.vd = (int(meta['qk_nope_head_dim']), int(meta['qk_rope_head_dim']),
                                         int(meta['v_head_dim']))
        self.batch, self.q_len, self.hidden = t['hidden_states'].shape
        self.kv_len, self.rank = t['ckv_cache'].shape[1], t['ckv_cache'].shape[2]
        self.scale = float(t['softmax_scale'][0])


class NumpyAccMe:
    def __init__(self, p, form, device, threads):
        if form != 'a_cc_me' or device != 'cpu':
            raise ValueError('the numpy peer is a_cc_me on the CPU only')
        self.p, t = p, p.t
        H, nope, vd, r = p.heads, p.nope, p.vd, p.rank
        kv_b = t['kv_b_proj.weight'].reshape(H, nope + vd, r)
        self.w_uk, self.w_uv = kv_b[:, :nope, :], kv_b[:, nope:, :]
        self.ckv = np.concatenate([t['ckv_cache'], np.zeros((p.batch, p.q_len, r), np.float32)], axis=1)
        self.kpe = np.concatenate([t['kpe_cache'], np.zeros((p.batch, p.q_len, p.rope), np.float32)], axis=1)
        L, S = p.kv_len, p.q_len
        self.mask = np.arange(L + S)[None, :] > (L + np.arange(S))[:, None]  # [S][keys]: future keys
        self.out = None

    @staticmethod
    def rms(x, w, eps):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w

    def step(self):
        p, t = self.p, self.p.t
        B, S, H, L = p.batch, p.q_len, p.heads, p.kv_len
        x = t['hidden_states']
        if 'q_a_proj.weight' in t:
            q = self.rms(x @ t['q_a_proj.weight'].T, t['q_a_layernorm.weight'], p.eps) @ t['q_b_proj.weight'].T
        else:
            q = x @ t['q_proj.weight'].T
        q = q.reshape(B, S, H, p.nope + p.rope)
        q_nope, q_pe = q[..., :p.nope], np.einsum('sij,bshj->bshi', t['rope'], q[..., p.nope:])
        kv = x @ t['kv_a_proj_with_mqa.weight'].T
        self.ckv[:, L:] = self.rms(kv[..., :p.rank], t['kv_a_layernorm.weight'], p.eps)
        self.kpe[:, L:] = np.einsum('sij,bsj->bsi', t['rope'], kv[..., p.rank:])
        q_abs = np.einsum('bshd,hdr->bshr', q_nope, self.w_uk)
        scores = (np.einsum('bshr,bkr->bshk', q_abs, self.ckv) + np.einsum('bshd,bkd->bshk', q_pe, self.kpe)) * p.scale
        scores = np.where(self.mask[None, :, None, :], -np.inf, scores)
        scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs = scores / scores.sum(axis=-1, keepdims=True)
        o_lat = np.einsum('bshk,bkr->bshr', probs, self.ckv)
        attn = np.einsum('bshr,hvr->bshv', o_lat, self.w_uv).reshape(B, S, H * p.vd)
        self.out = attn @ t['o_proj.weight'].T

    def run(self, flush):
        start = time.perf_counter()
        self.step()
        return time.perf_counter() - start

    def output(self):
        return np.asarray(self.out, dtype=np.float32)


class TorchMla:
    def __init__(self, p, form, device, threads, torch):
        self.torch, self.p, self.form = torch, p, form
        if device == 'cuda':
            if not torch.cuda.is_available():
                raise ValueError('torch sees no CUDA device')
            self.dev = torch.device('cuda')
            self.flush_buf = torch.empty(256 << 20, dtype=torch.uint8, device=self.dev)  # > the H100's / H200's L2
        else:
            self.dev = torch.device('cpu')
            torch.set_num_threads(max(1, threads))
            self.flush_buf = None
        bf = lambda a: torch.from_numpy(a).to(self.dev, torch.bfloat16)  # noqa: E731
        t = p.t
        self.w = {k: bf(v) for k, v in t.items() if k not in ('rope', 'softmax_scale', 'ckv_cache', 'kpe_cache')}
        self.rope_m = torch.from_numpy(t['rope']).to(self.dev, torch.float32)
        H, nope, vd, r, L, S, B = p.heads, p.nope, p.vd, p.rank, p.kv_len, p.q_len, p.batch
        kv_b = self.w['kv_b_proj.weight'].view(H, nope + vd, r)
        self.w_uk, self.w_uv = kv_b[:, :nope, :], kv_b[:, nope:, :]
        # The cache, preallocated with room for the new tokens (written in place each step).
        self.ckv = torch.zeros(B, L + S, r, dtype=torch.bfloat16, device=self.dev)
        self.kpe = torch.zeros(B, L + S, p.rope, dtype=torch.bfloat16, device=self.dev)
        self.ckv[:, :L] = bf(t['ckv_cache'])
        self.kpe[:, :L] = bf(t['kpe_cache'])
        if form == 'cd':  # the cached keys' K/V, decompressed once (CacheDecompressed's cache)
            self.k_nope = torch.zeros(B, L + S, H, nope, dtype=torch.bfloat16, device=self.dev)
            self.v = torch.zeros(B, L + S, H, vd, dtype=torch.bfloat16, device=self.dev)
            self.k_nope[:, :L] = torch.einsum('bkr,hdr->bkhd', self.ckv[:, :L], self.w_uk)
            self.v[:, :L] = torch.einsum('bkr,hvr->bkhv', self.ckv[:, :L], self.w_uv)
        self.mask = (torch.arange(L + S, device=self.dev)[None, :] >
                     (L + torch.arange(S, device=self.dev))[:, None])  # [S][keys]: future keys
        self.out = None
        if device == 'cuda':
            self.start, self.stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def rms(self, x, w):
        xf = x.float()
        return (xf * self.torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.p.eps)).to(x.dtype) * w

    def step(self):
        torch, p, w = self.torch, self.p, self.w
        B, S, H, L, nope, r = p.batch, p.q_len, p.heads, p.kv_len, p.nope, p.rank
        x = w['hidden_states']
        if 'q_a_proj.weight' in w:
            q = self.rms(x @ w['q_a_proj.weight'].T, w['q_a_layernorm.weight']) @ w['q_b_proj.weight'].T
        else:
            q = x @ w['q_proj.weight'].T
        q = q.view(B, S, H, nope + p.rope)
        q_nope = q[..., :nope]
        q_pe = torch.einsum('sij,bshj->bshi', self.rope_m, q[..., nope:].float()).to(torch.bfloat16)
        kv = x @ w['kv_a_proj_with_mqa.weight'].T
        self.ckv[:, L:] = self.rms(kv[..., :r], w['kv_a_layernorm.weight'])
        self.kpe[:, L:] = torch.einsum('sij,bsj->bsi', self.rope_m, kv[..., r:].float()).to(torch.bfloat16)
        if self.form in ('cd', 'cc'):
            if self.form == 'cd':  # the new tokens' K/V into the decompressed cache
                self.k_nope[:, L:] = torch.einsum('bkr,hdr->bkhd', self.ckv[:, L:], self.w_uk)
                self.v[:, L:] = torch.einsum('bkr,hvr->bkhv', self.ckv[:, L:], self.w_uv)
                k_nope, v = self.k_nope, self.v
            else:  # every key decompressed this step
                k_nope = torch.einsum('bkr,hdr->bkhd', self.ckv, self.w_uk)
                v = torch.einsum('bkr,hvr->bkhv', self.ckv, self.w_uv)
            scores = torch.einsum('bshd,bkhd->bhsk', q_nope, k_nope) + torch.einsum('bshd,bkd->bhsk', q_pe, self.kpe)
        else:
            q_abs = torch.einsum('bshd,hdr->bshr', q_nope, self.w_uk)
            if self.form == 'a_cc':  # one score over the concatenated key
                q_cat = torch.cat([q_abs, q_pe], dim=-1)
                scores = torch.einsum('bshc,bkc->bhsk', q_cat, torch.cat([self.ckv, self.kpe], dim=-1))
            else:
                scores = torch.einsum('bshr,bkr->bhsk', q_abs, self.ckv) + torch.einsum('bshd,bkd->bhsk', q_pe,
                                                                                        self.kpe)
        scores = scores.float() * p.scale
        scores = scores.masked_fill(self.mask[None, None], float('-inf'))
        probs = torch.softmax(scores, dim=-1).to(torch.bfloat16)
        if self.form in ('cd', 'cc'):
            attn = torch.einsum('bhsk,bkhv->bshv', probs, v)
        else:
            o_lat = torch.einsum('bhsk,bkr->bshr', probs, self.ckv)
            attn = torch.einsum('bshr,hvr->bshv', o_lat, self.w_uv)
        self.out = attn.reshape(B, S, H * p.vd) @ w['o_proj.weight'].T

    def run(self, flush):
        torch = self.torch
        with torch.no_grad():
            if self.dev.type == 'cuda':
                if flush:
                    self.flush_buf.zero_()
                self.start.record()
                self.step()
                self.stop.record()
                self.stop.synchronize()
                return self.start.elapsed_time(self.stop) / 1e3
            start = time.perf_counter()
            self.step()
            return time.perf_counter() - start

    def output(self):
        return self.out.float().cpu().numpy()


def probe(backend, device):
    if backend == 'numpy':
        return {'ok': True} if device == 'cpu' else {'skip': 'the numpy peer runs on the CPU only'}
    try:
        import torch
    except ImportError:
        return {'skip': 'needs torch (pip install torch into .venv, or DSLAB_PYTHON=an interpreter that has it)'}
    if device == 'cuda' and not torch.cuda.is_available():
        return {'skip': 'torch %s sees no CUDA device' % torch.__version__}
    return {'ok': True}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--backend', choices=['torch', 'numpy'], required=True)
    a = ap.parse_args()
    peer = None

    def prepare(msg):
        nonlocal peer
        p = Problem(msg['inputs'])
        if a.backend == 'numpy':
            peer = NumpyAccMe(p, msg['form'], msg['device'], msg.get('threads', 1))
        else:
            import torch
            peer = TorchMla(p, msg['form'], msg['device'], msg.get('threads', 1), torch)

    protocol.serve(probe=lambda msg: probe(a.backend, msg.get('device', 'cpu')), prepare=prepare,
                   run=lambda msg: peer.run(bool(msg.get('flush', True))), output=lambda: peer.output())


if __name__ == '__main__':
    main()
