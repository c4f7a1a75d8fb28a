#!/usr/bin/env python3
"""anchor_transformers.py: the PyTorch + transformers anchor for bench/RESULTS.md.

Times the same work as `bench MODEL --device cuda --prompt 512 --gen 128` on
the same checkpoint (a mkcheckpoint folder): prefill of a 512-token prompt
(one forward pass) and greedy decode of 128 tokens with the KV cache
(generate), in bf16 on the GPU, and reports the memory PyTorch held.

usage: anchor_transformers.py MODEL_DIR [--prompt 512] [--gen 128] [--reps 3]
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16).to("cuda").eval()
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, a.prompt), device="cuda")
    pre, dec = [], []
    with torch.inference_mode():
        for rep in range(-1, a.reps):  # rep -1 warms up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            model(ids, use_cache=False)
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            out = model.generate(ids, max_new_tokens=a.gen, min_new_tokens=a.gen, do_sample=False,
                                 pad_token_id=0, eos_token_id=None)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if rep < 0:
                continue
            n = out.shape[1] - a.prompt
            # generate's time includes its own prefill: subtract the one just measured
            pre.append(a.prompt / (t1 - t0))
            dec.append((n - 1) / ((t2 - t1) - (t1 - t0)))
    med = lambda v: sorted(v)[len(v) // 2]
    print(json.dumps({"model": a.model, "anchor": "pytorch+transformers", "torch": torch.__version__,
                      "device": torch.cuda.get_device_name(), "prompt": a.prompt, "gen": a.gen,
                      "prefill_tok_s": round(med(pre), 1), "decode_tok_s": round(med(dec), 2),
                      "max_allocated": torch.cuda.max_memory_allocated(),
                      "max_reserved": torch.cuda.max_memory_reserved()}))


if __name__ == "__main__":
    main()
