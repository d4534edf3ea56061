#!/usr/bin/env python3
"""Writes a small random DeepSeek checkpoint with Hugging Face transformers' own DeepseekV2 / DeepseekV3 classes, and
transformers' logits and greedy tokens for a prompt batch, for dslab's cross-checks against transformers.

The model has the real structure at small dims: a dense first layer, shared and routed experts, group-limited
routing (V2: softmax, group_limited_greedy; V3: sigmoid with e_score_correction_bias, noaux_tc), YaRN RoPE, a few
layers; V2 without q_lora_rank (V2-Lite's plain q_proj), V3 with it. --kind v3 also writes the fp8 form DeepSeek-V3
ships (e4m3 weights with 128x128 block scales, weight_scale_inv) of every projection and expert; transformers' logits
then come from the dequantised bf16 weights, which is what a loader that dequantises must reproduce.

OUT/ gets: config.json (the Hub's classic form: rope_scaling, rope_theta), model.safetensors.index.json and two
shards (*.safetensors), and golden.json: the prompts (token ids, mixed lengths), for each request the logits of its
last prompt position and of every one of --steps greedy decode steps ([steps + 1][vocab]), and the greedy tokens.
transformers runs in float32 on the CPU with the checkpoint's bf16 weights.
With --config FILE (a Hugging Face config.json, e.g. workloads/models/deepseek-v2-lite.json) the model is that one at
full size (random weights, the same init), its shards of up to 5 GB, and golden.json holds prompts and tokens only:
the logits go to golden.safetensors (logits.r<N>, float32 [steps + 1][vocab]); --device cuda builds and runs it on
the GPU (float32 weights there: 4 bytes a parameter), --prompt-lengths sets the batch. scripts/compare_logits.py then
runs dslab on the checkpoint and compares.
Usage: scripts/make_checkpoint.py (--kind v2|v3 | --config FILE) --out DIR [--seed N] [--steps N] [--layers N]
       [--device cpu|cuda] [--prompt-lengths 7,3,12,5]
Needs torch, transformers and safetensors (not in scripts/requirements.txt: the goldens are committed)."""
import argparse
import json
import math
import os
import sys


def fail(msg):
    print('make_checkpoint: ' + msg, file=sys.stderr)
    sys.exit(2)


def config_dict(kind, layers):
    c = {
        'vocab_size': 512, 'hidden_size': 128, 'intermediate_size': 192, 'moe_intermediate_size': 48,
        'num_hidden_layers': layers, 'num_attention_heads': 4, 'num_key_value_heads': 4,
        'n_shared_experts': 1, 'n_routed_experts': 16, 'num_experts_per_tok': 4, 'n_group': 4, 'topk_group': 2,
        'first_k_dense_replace': 1, 'moe_layer_freq': 1, 'kv_lora_rank': 64, 'qk_nope_head_dim': 32,
        'qk_rope_head_dim': 16, 'v_head_dim': 32, 'max_position_embeddings': 4096, 'rms_norm_eps': 1e-6,
        'rope_theta': 10000.0,
        'rope_scaling': {'type': 'yarn', 'factor': 4.0, 'original_max_position_embeddings': 1024, 'beta_fast': 32,
                         'beta_slow': 1, 'mscale': 0.707, 'mscale_all_dim': 0.707},
        'tie_word_embeddings': False, 'hidden_act': 'silu', 'initializer_range': 0.02, 'bos_token_id': 0,
        'eos_token_id': 1,
    }
    if kind == 'v2':
        c.update({'architectures': ['DeepseekV2ForCausalLM'], 'model_type': 'deepseek_v2', 'q_lora_rank': None,
                  'topk_method': 'group_limited_greedy', 'scoring_func': 'softmax', 'norm_topk_prob': False,
                  'routed_scaling_factor': 1.0})
    else:
        c.update({'architectures': ['DeepseekV3ForCausalLM'], 'model_type': 'deepseek_v3', 'q_lora_rank': 96,
                  'topk_method': 'noaux_tc', 'scoring_func': 'sigmoid', 'norm_topk_prob': True,
                  'routed_scaling_factor': 2.5})
    return c


def quantise_fp8(torch, w, block=128):
    """e4m3 weight and float32 weight_scale_inv [ceil(out/128)][ceil(in/128)] with w ~= fp8 * scale (per block)."""
    out_f, in_f = w.shape
    rows, cols = math.ceil(out_f / block), math.ceil(in_f / block)
    q = torch.empty(out_f, in_f, dtype=torch.float8_e4m3fn)
    scale = torch.empty(rows, cols, dtype=torch.float32)
    deq = torch.empty(out_f, in_f, dtype=torch.float32)
    for i in range(rows):
        for j in range(cols):
            tile = w[i * block:(i + 1) * block, j * block:(j + 1) * block].float()
            s = max(tile.abs().max().item() / 448.0, 1e-12)
            qt = (tile / s).to(torch.float8_e4m3fn)
            q[i * block:(i + 1) * block, j * block:(j + 1) * block] = qt
            scale[i, j] = s
            deq[i * block:(i + 1) * block, j * block:(j + 1) * block] = qt.float() * s
    return q, scale, deq


def main():
    p = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    p.add_argument('--kind', choices=['v2', 'v3'])
    p.add_argument('--config', help='a Hugging Face config.json: that model at full size (random weights)')
    p.add_argument('--device', default='cpu', help='where transformers builds and runs the model (cpu, cuda)')
    p.add_argument('--prompt-lengths', default='7,3,12,5', help='the prompt batch (default 7,3,12,5)')
    p.add_argument('--out', required=True)
    p.add_argument('--seed', type=int, default=1234)
    p.add_argument('--steps', type=int, default=8, help='greedy decode steps after the prompt (default 8)')
    p.add_argument('--layers', type=int, default=None, help='decoder layers (default 3: one dense, two MoE; --config: '
                   'the config\'s)')
    a = p.parse_args()
    if (a.kind is None) == (a.config is None):
        fail('give one of --kind and --config')
    if a.steps < 1 or (a.layers is not None and a.layers < 2):
        fail('--steps must be >= 1 and --layers >= 2 (a dense layer and a MoE layer)')
    try:
        lengths = [int(n) for n in a.prompt_lengths.split(',')]
        if not lengths or min(lengths) < 1:
            raise ValueError
    except ValueError:
        fail('--prompt-lengths %r: expected positive integers, e.g. 7,3,12,5' % a.prompt_lengths)
    try:
        import torch
        import transformers
        from safetensors.torch import save_file
    except ImportError as e:
        fail('needs torch, transformers and safetensors (%s)' % e)

    torch.manual_seed(a.seed)
    if a.config:
        try:
            with open(a.config) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            fail('%s: %s' % (a.config, e))
        kind = {'deepseek_v2': 'v2', 'deepseek_v3': 'v3'}.get(cfg.get('model_type'))
        if kind is None:
            fail('%s: field model_type %r: expected deepseek_v2 or deepseek_v3' % (a.config, cfg.get('model_type')))
        if a.layers is not None:
            cfg['num_hidden_layers'] = a.layers
        cfg.pop('quantization_config', None)  # (written bf16; --kind v3 makes the fp8 form)
    else:
        kind = a.kind
        cfg = config_dict(a.kind, a.layers or 3)
    hf_cfg = json.loads(json.dumps(cfg))  # (a deep copy: transformers rewrites rope_scaling in place)
    for k in ('architectures', 'model_type', 'scoring_func', 'auto_map', 'torch_dtype'):
        hf_cfg.pop(k, None)  # (transformers' V3 is always sigmoid, its V2 always softmax)
    with torch.device(a.device):
        if kind == 'v2':
            model = transformers.DeepseekV2ForCausalLM(transformers.DeepseekV2Config(**hf_cfg))
        else:
            model = transformers.DeepseekV3ForCausalLM(transformers.DeepseekV3Config(**hf_cfg))
    model.eval()
    # Weights larger than the default init (std 0.02 leaves a tiny model's logits nearly flat and its routing a
    # coin toss between near-equal scores): every matrix N(0, 1/in_features), norms around 1, biases of V3's router
    # spread so that they matter; all rounded to bf16, the checkpoint's dtype.
    with torch.no_grad():
        for name, t in model.named_parameters():
            if t.dim() == 2:
                t.copy_(torch.randn_like(t) / math.sqrt(t.shape[1]))
            elif t.dim() == 3:  # stacked experts [experts][out][in]
                t.copy_(torch.randn_like(t) / math.sqrt(t.shape[2]))
            elif 'norm' in name:
                t.copy_(1.0 + 0.1 * torch.randn_like(t))
            t.copy_(t.to(torch.bfloat16).float())
        for name, b in model.named_buffers():
            if name.endswith('e_score_correction_bias'):
                b.copy_(0.05 * torch.randn_like(b))
    tensors = {}
    for name, t in model.state_dict().items():
        if 'rotary_emb' in name:
            continue
        tensors[name] = t
    # The Hub's layout: experts one module each (mlp.experts.E.{gate,up,down}_proj.weight), as DeepSeek's checkpoints
    # name them; transformers 5 stacks them into experts.gate_up_proj [E][2I][H] and experts.down_proj [E][H][I].
    hub = {}
    for name, t in tensors.items():
        if name.endswith('mlp.experts.gate_up_proj'):
            prefix = name[:-len('gate_up_proj')]
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                hub['%s%d.gate_proj.weight' % (prefix, e)] = t[e, :inter].contiguous()
                hub['%s%d.up_proj.weight' % (prefix, e)] = t[e, inter:].contiguous()
        elif name.endswith('mlp.experts.down_proj'):
            prefix = name[:-len('down_proj')]
            for e in range(t.shape[0]):
                hub['%s%d.down_proj.weight' % (prefix, e)] = t[e].contiguous()
        else:
            hub[name] = t.contiguous()
    for name in list(hub):
        t = hub[name]
        hub[name] = t.float() if name.endswith('e_score_correction_bias') else t.to(torch.bfloat16)
    if a.kind == 'v3':  # (--kind only)
        # fp8 every projection and expert (as DeepSeek-V3 ships them: not the embedding, LM head, norms or router),
        # and put the dequantised values back into the model: transformers' logits come from what a loader gets.
        state = model.state_dict()
        for name in list(hub):
            t = hub[name]
            if t.dim() != 2 or not name.endswith('_proj.weight') or 'layernorm' in name:
                continue
            q, scale, deq = quantise_fp8(torch, t.float())
            hub[name] = q
            hub[name[:-len('weight')] + 'weight_scale_inv'] = scale
            hub[name] = q
            deq_bf16 = deq.to(torch.bfloat16).float()
            if name in state:
                state[name].copy_(deq_bf16)
            else:  # an expert's slice of the stacked tensors
                parts = name.split('.')
                e, proj = int(parts[-3]), parts[-2]
                base = '.'.join(parts[:-3])
                with torch.no_grad():
                    if proj == 'down_proj':
                        state[base + '.down_proj'][e].copy_(deq_bf16)
                    else:
                        inter = state[base + '.gate_up_proj'].shape[1] // 2
                        rows = slice(0, inter) if proj == 'gate_proj' else slice(inter, 2 * inter)
                        state[base + '.gate_up_proj'][e, rows].copy_(deq_bf16)
        cfg['quantization_config'] = {'quant_method': 'fp8', 'fmt': 'e4m3', 'activation_scheme': 'dynamic',
                                      'weight_block_size': [128, 128]}

    os.makedirs(a.out, exist_ok=True)
    names = sorted(hub)
    if a.config:  # shards of up to 5 GB, as the Hub's
        groups, size = [[]], 0
        for k in names:
            n = hub[k].numel() * hub[k].element_size()
            if groups[-1] and size + n > 5e9:
                groups.append([])
                size = 0
            groups[-1].append(k)
            size += n
    else:
        half = len(names) // 2
        groups = [names[:half], names[half:]]
    shards = {'model-%05d-of-%05d.safetensors' % (i + 1, len(groups)): g for i, g in enumerate(groups)}
    weight_map = {}
    total = 0
    for shard, keys in shards.items():
        save_file({k: hub[k].cpu() for k in keys}, os.path.join(a.out, shard), metadata={'format': 'pt'})
        for k in keys:
            weight_map[k] = shard
            total += hub[k].numel() * hub[k].element_size()
    with open(os.path.join(a.out, 'model.safetensors.index.json'), 'w') as f:
        json.dump({'metadata': {'total_size': total}, 'weight_map': weight_map}, f, indent=1)
    cfg['torch_dtype'] = 'bfloat16'
    with open(os.path.join(a.out, 'config.json'), 'w') as f:
        json.dump(cfg, f, indent=1)

    # The prompts: mixed lengths, fixed seed; each request run alone (no padding), prefill then greedy steps.
    g = torch.Generator().manual_seed(a.seed + 1)
    prompts = [torch.randint(2, cfg['vocab_size'], (n,), generator=g).tolist() for n in lengths]
    golden, tokens = {}, []
    with torch.no_grad():
        for r, prompt in enumerate(prompts):
            ids = torch.tensor([prompt], device=a.device)
            out = model(input_ids=ids, use_cache=True)
            cache = out.past_key_values
            logits = [out.logits[0, -1].float()]
            generated = []
            for _ in range(a.steps):
                nxt = int(torch.argmax(logits[-1]))
                generated.append(nxt)
                out = model(input_ids=torch.tensor([[nxt]], device=a.device), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits[0, -1].float())
            golden['logits.r%d' % r] = torch.stack(logits).cpu().contiguous()
            tokens.append(generated)
        # transformers in bf16 on the same weights, fed the float32 run's tokens: how far a bf16 engine lands from
        # float32 by its arithmetic alone, the yardstick dslab's bf16 logits are held to.
        model.to(torch.bfloat16)
        for r, prompt in enumerate(prompts):
            out = model(input_ids=torch.tensor([prompt], device=a.device), use_cache=True)
            cache, rows = out.past_key_values, [out.logits[0, -1].float()]
            for nxt in tokens[r]:
                out = model(input_ids=torch.tensor([[nxt]], device=a.device), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                rows.append(out.logits[0, -1].float())
            golden['logits_bf16.r%d' % r] = torch.stack(rows).cpu().contiguous()
    if a.config:  # a full-size vocabulary: the logits as tensors
        save_file(golden, os.path.join(a.out, 'golden.safetensors'), metadata={'format': 'pt'})
        with open(os.path.join(a.out, 'golden.json'), 'w') as f:
            json.dump({'prompts': prompts, 'tokens': tokens, 'steps': a.steps, 'seed': a.seed,
                       'transformers': transformers.__version__, 'torch': torch.__version__, 'device': a.device,
                       'about': 'golden.safetensors logits.r<N>: request N\'s logits (float32) at row s - row 0 the '
                                'last prompt position, row s the s-th greedy step; tokens[r][s] the greedy choice '
                                'after row s; logits_bf16.r<N>: the same model in bf16, fed those tokens'}, f)
        print('wrote %s: %d tensors, %.1f GB, %d requests x %d steps' % (a.out, len(hub), total / 1e9, len(prompts),
                                                                       a.steps))
        return
    with open(os.path.join(a.out, 'golden.json'), 'w') as f:
        json.dump({'prompts': prompts, 'tokens': tokens, 'steps': a.steps, 'seed': a.seed,
                   'transformers': transformers.__version__, 'torch': torch.__version__,
                   'about': 'logits[r][s]: request r\'s logits (float32, 7 digits) at row s - row 0 the last prompt '
                            'position, row s the s-th greedy step; tokens[r][s] the greedy choice after row s; '
                            'logits_bf16: the same model in bf16 (5 digits), fed those tokens',
                   'logits': [[[float('%.7g' % v) for v in row.tolist()] for row in golden['logits.r%d' % r]]
                              for r in range(len(prompts))],
                   'logits_bf16': [[[float('%.5g' % v) for v in row.tolist()] for row in golden['logits_bf16.r%d' % r]]
                                   for r in range(len(prompts))]}, f)
    print('wrote %s: %d tensors, %.1f MB, %d requests x %d steps' %
          (a.out, len(hub), total / 1e6, len(prompts), a.steps))


if __name__ == '__main__':
    main()
