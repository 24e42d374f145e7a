#!/usr/bin/python3
"""../shared/peers/torch_gpt.py with its forward pass under PyTorch's CPU autocast to bfloat16
(torch.autocast("cpu", dtype=torch.bfloat16)): bf16 products, f32 weights, gradients and AdamW,
the PyTorch counterpart of hpm's `[train] precision = "bf16"`. Same arguments and JSON line as
torch_gpt.py; with --world W, every DistributedDataParallel process runs under autocast too (the
patch below runs on import, and spawn imports this file in each child).
"""
import argparse, os, sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared", "peers"))
import peer_env  # noqa: E402

if __name__ == "__main__":  # OpenBLAS reads its thread count when torch loads: tune first
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--threads", type=int, default=1)
    peer_env.tune(pre.parse_known_args()[0].threads)
import torch_gpt  # noqa: E402
import torch  # noqa: E402

_forward = torch_gpt.GPT.forward


def _autocast_forward(self, idx, targets):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return _forward(self, idx, targets)


torch_gpt.GPT.forward = _autocast_forward

if __name__ == "__main__":
    a = torch_gpt.parse()
    if a.world > 1:
        import random, json, torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        q = ctx.SimpleQueue()
        mp.spawn(torch_gpt.ddp_rank, args=(a, random.randint(20000, 60000), q), nprocs=a.world)
        res = q.get()
        res["precision"] = "bf16 autocast"
        print(json.dumps(res))
    else:
        torch_gpt.main(a)
