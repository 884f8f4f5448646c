#!/usr/bin/env python3
"""The tables of docs/SCALING.md "Which models fit on 8 x H200": each
rank's model state by engined's own byte accounting
(engined_client.memory, the figures GetStatus's Memory reports and
tests/integration/test_zero_stages.py checks), for public model shapes.

    PYTHONPATH=client/python python3 tests/bench/scaling_table.py [--world 8]
"""
import argparse

from engined_client.memory import llama_parts, rank_memory

# name: hidden, intermediate, layers, heads, kv_heads, vocab, qkv_bias, tied
MODELS = {
    "Qwen2.5-7B": (3584, 18944, 28, 28, 4, 152064, True, False),
    "Llama-3.1-8B": (4096, 14336, 32, 32, 8, 128256, False, False),
    "Qwen2.5-14B": (5120, 13824, 48, 40, 8, 152064, True, False),
    "Qwen2.5-32B": (5120, 27648, 64, 40, 8, 152064, True, False),
    "Llama-3.1-70B": (8192, 28672, 80, 64, 8, 128256, False, False),
    "Qwen2.5-72B": (8192, 29568, 80, 64, 8, 152064, True, False),
}
H200_GB = 141.0
RESERVE_GB = 16.0   # activations (with recompute), CUDA context, workspaces


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=8)
    a = ap.parse_args()
    W = a.world
    print("| model | parameters | ZeRO-1 | ZeRO-2 | ZeRO-3 | ZeRO-3, moments on the host |")
    print("|---|---|---|---|---|---|")
    for name, (C, F, L, H, KV, V, bias, tied) in MODELS.items():
        P, layer, embed, head = llama_parts(C, F, L, H, KV, V, qkv_bias=bias, tied=tied)
        cells = []
        for stage, offload in ((1, False), (2, False), (3, False), (3, True)):
            p, g, o, parts = rank_memory(P, W, stage, layer, embed, head)
            gb = (p + g + parts + (0 if offload else o)) / 1e9
            fits = gb + RESERVE_GB <= H200_GB
            cells.append("%.0f GB%s" % (gb, "" if fits else " (no)"))
        print("| %s | %.1fB | %s |" % (name, P / 1e9, " | ".join(cells)))


if __name__ == "__main__":
    main()
