#!/usr/bin/env python3
"""dslab's whole-step peer: Hugging Face transformers' DeepSeek model (DeepseekV2ForCausalLM / DeepseekV3ForCausalLM,
whichever the checkpoint's config names) decoding one token per request over a cache of its own prefill, driven by
dslab over stdin / stdout, one JSON object a line (variants/peers/peer_process.h, scripts/peers/README.md).

prepare {"weights": DIR, "inputs": FILE, "device": "cpu" | "cuda", "threads": N, "compile": bool}: loads the
checkpoint (once per folder, bf16), reads the requests' prompt ids [batch][kv_len] and step ids [batch] from the
inputs file (a safetensors file dslab writes), and prefills the prompts into a DynamicCache (untimed).
run: one decode step of the batch (the step ids at position kv_len), timed by CUDA events on the GPU or the clock on
the CPU; the cache is cropped back to the prompts after it (untimed), so every run decodes the same step.
output: that step's logits [batch][vocab] as raw float32. compile: the model's forward through torch.compile (the
step then runs compiled; prepare's three untimed runs compile it)."""
import inspect
import time

import numpy as np

import protocol


def probe(device):
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as e:
        return {'skip': 'needs torch and transformers (%s; pip install them into .venv, or DSLAB_PYTHON=an '
                        'interpreter that has them)' % e}
    if device == 'cuda' and not torch.cuda.is_available():
        return {'skip': 'torch %s sees no CUDA device' % torch.__version__}
    return {'ok': True}


class HfStep:
    def __init__(self):
        self.weights = None
        self.model = None

    def prepare(self, msg):
        import torch
        from transformers import AutoModelForCausalLM, DynamicCache
        self.torch = torch
        self.device = msg['device']
        if self.device == 'cpu':
            torch.set_num_threads(int(msg.get('threads', 1)))
        key = (msg['weights'], self.device, bool(msg.get('compile', False)))
        if self.weights != key:
            self.model = None
            model = AutoModelForCausalLM.from_pretrained(msg['weights'], dtype=torch.bfloat16)
            self.model = model.to(self.device).eval()
            self.forward = torch.compile(self.model) if key[2] else self.model
            self.weights = key
        t, _ = protocol.read_safetensors(msg['inputs'])
        self.prompt = torch.from_numpy(t['prompt'].astype(np.int64)).to(self.device)
        self.step_ids = torch.from_numpy(t['step'].astype(np.int64)).reshape(-1, 1).to(self.device)
        self.kv_len = int(self.prompt.shape[1])
        # (the cache argument's name: `cache` in newer transformers, `past_key_values` before)
        self.cache_arg = 'cache' if 'cache' in inspect.signature(self.model.forward).parameters else 'past_key_values'
        with torch.inference_mode():
            self.cache = DynamicCache(config=self.model.config)
            self.model(input_ids=self.prompt, use_cache=True, **{self.cache_arg: self.cache})
        self.positions = torch.full_like(self.step_ids, self.kv_len)
        self.logits = None
        if key[2]:
            # Compiled: its first calls compile (the first sees the prefill's cache, the next ones the cache cropped
            # back to it: new strides, a recompile), ~30 s each on an H200 host; untimed here, so that the timed runs
            # replay the compiled step (timed, the sampling of one point gave up after two such calls).
            for _ in range(3):
                self.run()

    def run(self):
        torch = self.torch
        with torch.inference_mode():
            if self.device == 'cuda':
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                start.record()
                out = self.forward(input_ids=self.step_ids, position_ids=self.positions, use_cache=True,
                                   **{self.cache_arg: self.cache})
                stop.record()
                torch.cuda.synchronize()
                seconds = start.elapsed_time(stop) * 1e-3
            else:
                begin = time.perf_counter()
                out = self.forward(input_ids=self.step_ids, position_ids=self.positions, use_cache=True,
                                   **{self.cache_arg: self.cache})
                seconds = time.perf_counter() - begin
            self.logits = out.logits[:, -1, :]
            # (back to the prompts, so the next run decodes the same step: a negative crop removes that many tokens)
            self.cache.crop(self.kv_len - self.cache.get_seq_length())
        return seconds

    def output(self):
        return self.logits.float().cpu().numpy()


def main():
    peer = HfStep()
    protocol.serve(probe=lambda msg: probe(msg.get('device', 'cpu')), prepare=peer.prepare,
                   run=lambda msg: peer.run(), output=peer.output)


if __name__ == '__main__':
    main()
