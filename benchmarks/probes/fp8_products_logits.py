"""A Hugging Face DeepSeek-V3 model's verify logits with an e4m3 cache, exact and fp8-products modes, against float64.

    python benchmarks/probes/fp8_products_logits.py [OUT_DIR]

CPU (the pure path applies each mode's roundings) or GPU. Two random-weight
models (the adapter's tiny config, and one at DeepSeek's attention widths:
Dl 512, Dr 64, 16 heads), W = 2, interleave 2, a ragged verify step of q = 3
after a 17-token prefill (tests/test_hf.py's ``ragged_steps``); each
request's logits against HF's own float64 forward on the same tokens:
relative L2 and max error, and whether the greedy tokens agree. Random
weights amplify any perturbation far more than a trained model does: read
the modes' errors against each other, not as a model's accuracy.
"""
import json
import pathlib
import sys

import torch

from mla_dcp.models import hf

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "tests"))
from test_hf import ragged_steps, reference_logits  # noqa: E402

WIDTHS = {"tiny": {}, "deepseek": dict(kv_lora_rank=512, qk_rope_head_dim=64, num_attention_heads=16,
                                       num_key_value_heads=16, hidden_size=256)}
# A power of two that keeps both models' latents unsaturated in e4m3 (|latent| / 8 < 448).
KV_SCALE = 1 / 8
MODES = {"float32 cache": {}, "e4m3 cache, exact": dict(kv_scale=KV_SCALE),
         "e4m3 cache, fp8_products": dict(kv_scale=KV_SCALE, fp8_products=True)}


def main():
    result = {}
    for width, dims in WIDTHS.items():
        model = hf.tiny_model("deepseek_v3", seed=0, **dims)
        model64 = hf.tiny_model("deepseek_v3", seed=0, dtype=torch.float64, **dims)
        tokens = torch.randint(0, 128, (2, 40), generator=torch.Generator().manual_seed(3))
        for mode, options in MODES.items():
            verifier = hf.MLAVerifier(model, dcp_world_size=2, interleave=2, block_size=16, max_len=64, batch=2,
                                      **options)
            logits, sequences = ragged_steps(verifier, tokens, 17, 3)
            rows = []
            for b, seq in enumerate(sequences):
                exact = reference_logits(model64, [seq])[0][-3:]
                d = logits[b].double() - exact
                rows.append({"rel_l2": (d.norm() / exact.norm()).item(),
                             "max_rel": (d.abs().max() / exact.abs().max()).item(),
                             "tokens_equal": bool(torch.equal(logits[b].argmax(-1), exact.argmax(-1)))})
            result[f"{width}: {mode}"] = rows
            print(f"{width:9s} {mode:26s}", "  ".join(f"{r['rel_l2']:.2e} ({'=' if r['tokens_equal'] else 'x'})"
                                                     for r in rows), flush=True)
    if len(sys.argv) > 1:
        out = pathlib.Path(sys.argv[1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "fp8_products_logits.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
