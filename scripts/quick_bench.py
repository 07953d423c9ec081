"""Orientation timing of one rank's whole verify step next to the ceilings.

Not the benchmark suite (that is `python -m mla_dcp.bench`, later): C1 and C4
of the performance issue, the Triton path and the pure path on the GPU, the
copy bandwidth and bf16 matmul rate measured in the same run.
"""

import json
import sys

import torch
import triton.testing

import mla_dcp


def ceilings():
    n = 1 << 30  # 2 GiB of bf16
    src = torch.empty(n, dtype=torch.bfloat16, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=200)
    copy_bw = 2 * src.numel() * 2 / (copy_ms * 1e-3)
    del src, dst
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    mm_ms = triton.testing.do_bench(lambda: a @ b, warmup=50, rep=200)
    return copy_bw, 2 * 8192 ** 3 / (mm_ms * 1e-3)


def config_case(name, batch, qlen, heads, local_len, block, kv_dtype):
    cfg = mla_dcp.VerifyConfig(num_heads=heads, qlen=qlen, block_size=block, max_model_len=local_len,
                               softmax_scale=192 ** -0.5)
    blocks = batch * local_len // block
    perm = torch.randperm(blocks, device="cuda").to(torch.int32).view(batch, -1)
    seq_lens = torch.full((batch,), local_len, dtype=torch.int32, device="cuda")
    q = torch.randn(batch * qlen, heads, 576, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(blocks, block, 576, device="cuda", dtype=torch.bfloat16)
    scale = None
    if kv_dtype == "fp8":
        kv = kv.to(torch.float8_e4m3fn)
        scale = torch.ones(1, device="cuda")
    return name, cfg, seq_lens, perm, q, kv, scale


def main():
    copy_bw, mm_rate = ceilings()
    rows = [{"ceiling_copy_TBps": copy_bw / 1e12, "ceiling_bf16_TFLOPs": mm_rate / 1e12}]
    print(rows[0])
    for name, cfg, seq_lens, table, q, kv, scale in [
        config_case("C1", 32, 3, 128, 8192, 64, "bf16"),
        config_case("C2", 32, 3, 128, 8192, 64, "fp8"),
        config_case("C4", 64, 2, 16, 4096, 64, "bf16"),
        config_case("C7", 1, 2, 16, 4096, 64, "bf16"),
    ]:
        batch, L = seq_lens.shape[0], cfg.max_model_len
        kv_bytes = batch * L * 576 * kv.element_size()
        io_bytes = q.numel() * 2 + q.shape[0] * cfg.num_heads * 512 * 2
        flops = 2 * batch * cfg.qlen * cfg.num_heads * L * (576 + 512)
        floor = max((kv_bytes + io_bytes) / copy_bw, flops / mm_rate)

        def step():
            view = mla_dcp.build_view(cfg, seq_lens, table)
            return mla_dcp.verify(cfg, view, q, kv, scale)
        t_triton = triton.testing.do_bench(step, warmup=25, rep=100) * 1e-3
        view = mla_dcp.build_view(cfg, seq_lens, table)
        attn_only = triton.testing.do_bench(lambda: mla_dcp.ops.segmented_attention(
            q, kv, scale, view.row_lens, view.page_table, cfg.qlen, 512,
            mla_dcp.num_segments_for(cfg, batch, q.device, q.dtype), cfg.scale), warmup=25, rep=100) * 1e-3
        from mla_dcp import pure

        def pure_step():
            v = mla_dcp.api.VerifyView(pure.verify_row_lens(seq_lens, cfg.qlen, 1, 0, 1),
                                       pure.expand_page_table(table, cfg.block_size, cfg.max_local_len))
            so = pure.segmented_attention(q, kv, v.row_lens, v.page_table, qlen=cfg.qlen, kv_lora_rank=512,
                                          num_segments=4, softmax_scale=cfg.scale, kv_scale=scale)
            return pure.merge_segments(*so, q.dtype)
        t_pure = triton.testing.do_bench(pure_step, warmup=3, rep=20) * 1e-3 if name != "C7" else float("nan")
        row = dict(config=name, floor_us=floor * 1e6, triton_us=t_triton * 1e6, ratio=t_triton / floor,
                   attention_kernel_us=attn_only * 1e6, pure_gpu_us=t_pure * 1e6,
                   segments=mla_dcp.num_segments_for(cfg, batch, q.device, q.dtype))
        print(json.dumps(row))
        rows.append(row)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
