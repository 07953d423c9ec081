"""`python -m mla_dcp hf-demo`: speculative decoding of a Hugging Face DeepSeek model through mla_dcp.

With no ``--model``, a tiny random DeepSeek-V3 built from a config (runs on
any machine; the prompt's bytes are its tokens). With ``--model DIR``, a
local DeepSeek-V2/V3 or Kimi-K2 checkpoint and its tokenizer. Drafts come
from prompt lookup; each step verifies ``--drafts`` tokens in one call, with
the cache sharded over ``--dcp`` simulated DCP ranks (or ``--ranks`` real
processes). Prints the acceptance rate, the tokens per verify step, each
verify step's time split into attention, DCP merge and the rest, and
whether the tokens equal the model's own greedy ``generate``: exits 1 if
they do not. ``--batch N`` decodes the prompt and its N - 1 shorter
prefixes together, each with as many drafts a step as prompt lookup finds
for it (none for some): every step one ragged call. ``--tree`` drafts a token
tree instead: every continuation prompt lookup finds, up to ``--drafts`` nodes
below the last token, verified in one masked call (``build_view(block_mask=...)``).
"""

from __future__ import annotations

import argparse
import sys
import time

import torch


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m mla_dcp hf-demo", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", help="a local checkpoint folder (default: a tiny random DeepSeek-V3)")
    parser.add_argument("--family", choices=("deepseek_v3", "deepseek_v2", "kimi_k2", "deepseek_v32", "glm_moe_dsa"),
                        default="deepseek_v3",
                        help="the tiny random model's family when no --model is given (default deepseek_v3; "
                             "deepseek_v32 and glm_moe_dsa: DeepSeek-V3.2's and GLM-5's sparse attention)")
    parser.add_argument("--dcp", type=int, default=2, help="simulated DCP ranks in this process (default 2)")
    parser.add_argument("--ranks", type=int, default=0, help="real DCP processes instead (gloo, or NCCL on GPUs)")
    parser.add_argument("--interleave", type=int, default=1, help="DCP interleave size (default 1)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per cache block (default 16)")
    parser.add_argument("--drafts", type=int, default=3, help="draft tokens verified per step (default 3)")
    parser.add_argument("--prompt", default="the cat sat on the mat; the cat sat on the", help="the prompt")
    parser.add_argument("--max-new-tokens", type=int, default=24, help="tokens to generate (default 24)")
    parser.add_argument("--tree", action="store_true",
                        help="draft a token tree (every continuation prompt lookup finds, up to --drafts nodes)")
    parser.add_argument("--batch", type=int, default=1,
                        help="requests decoded together: the prompt and its shorter prefixes, each with its own "
                             "drafts a step (default 1)")
    parser.add_argument("--device", default="cpu", help="device (default cpu)")
    return parser


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("dcp", "interleave", "block_size", "drafts", "max_new_tokens", "batch"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.ranks < 0:
        parser.error(f"--ranks must be >= 0, got {args.ranks}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device} needs a GPU; this torch ({torch.__version__}) sees none")
    try:
        import transformers  # noqa: F401
    except ImportError:
        parser.error("hf-demo needs transformers: pip install 'mla_dcp[hf]'")


def _model_and_prompt(args):
    from mla_dcp.models import hf

    if args.model:
        import transformers

        model = hf.load_model(args.model, device=args.device)
        tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
        return model, tokenizer.encode(args.prompt), tokenizer.decode
    model = hf.tiny_model(args.family, seed=0).to(args.device)
    vocab = model.config.vocab_size
    return model, [b % vocab for b in args.prompt.encode()], lambda tokens: " ".join(map(str, tokens))


def run(args, group=None) -> bool:
    """One speculative decode and its check against greedy ``generate``; prints on rank 0."""
    from mla_dcp.models import hf

    model, prompt, decode = _model_and_prompt(args)
    # The prompt and its shorter prefixes (at least one token each).
    prompts = [prompt[:max(1, len(prompt) - 3 * i)] for i in range(args.batch)]
    max_len = len(prompt) + args.max_new_tokens + args.drafts + 1
    verifier = hf.MLAVerifier(model, dcp_world_size=args.dcp, interleave=args.interleave, block_size=args.block_size,
                              max_len=max_len, group=group, timed=True, batch=args.batch)
    eos = model.generation_config.eos_token_id

    def generate(max_new_tokens):
        if args.tree:
            return hf.speculative_generate_tree(verifier, prompts, max_new_tokens, nodes=args.drafts + 1,
                                                eos_token_id=eos)
        if args.batch == 1:
            return [hf.speculative_generate(verifier, prompt, max_new_tokens, drafts=args.drafts, eos_token_id=eos)]
        return hf.speculative_generate_batch(verifier, prompts, max_new_tokens, drafts=args.drafts,
                                             eos_token_id=eos)

    # A short generation first: the timed one then holds no kernel compilation (a GPU's first steps).
    generate(min(args.max_new_tokens, 4))
    start = time.perf_counter()
    results = generate(args.max_new_tokens)
    elapsed = time.perf_counter() - start
    wants, stops = [], set(eos) if isinstance(eos, (list, tuple)) else {eos}
    with torch.inference_mode():
        for request in prompts:
            want = model.generate(torch.tensor([request], device=model.device), max_new_tokens=args.max_new_tokens,
                                  do_sample=False)[0, len(request):].tolist()
            stop = next((i + 1 for i, token in enumerate(want) if token in stops), len(want))
            wants.append(want[:stop])
    same = [result.tokens for result in results] == wants
    if group is None or verifier.ranks == [0]:
        drafts = f"{args.drafts} drafts per step" if args.batch == 1 else \
            f"{args.batch} requests, up to {args.drafts} drafts each per step (as many as prompt lookup finds)"
        if args.tree:
            drafts = (f"{args.batch} request{'s' * (args.batch > 1)}, a tree of up to {args.drafts} drafts each "
                      f"per step (every continuation prompt lookup finds)")
        print(f"model: {type(model).__name__} ({args.model or 'tiny random ' + args.family}), "
              f"DCP W={verifier.world} interleave={args.interleave}, {drafts}")
        for b, result in enumerate(results):
            who = "" if args.batch == 1 else f"request {b} ({len(prompts[b])} prompt tokens): "
            print(f"{who}generated: {decode(result.tokens)}")
            print(f"{who}verify steps: {result.verify_steps}, acceptance rate {result.acceptance_rate:.2f}, "
                  f"tokens per verify step {result.tokens_per_step:.2f}")
        print(f"generation: {elapsed:.2f} s")
        times = results[0].times
        ranks = f"this rank's of {verifier.world}" if group is not None else f"{verifier.world} simulated rank{'s' * (verifier.world > 1)}"
        print(f"per verify step (mean of {times.steps}): attention {times.attention_us:.0f} us ({ranks}), "
              f"DCP merge {times.merge_us:.0f} us, rest {times.rest_us:.0f} us, whole step {times.step_us:.0f} us")
        print(f"equal to the model's own greedy generate: {'yes' if same else 'NO'}")
        if not same:
            for b, (result, want) in enumerate(zip(results, wants)):
                if result.tokens != want:
                    print(f"request {b} want: {decode(want)}")
    return same


def _process_main(rank: int, world: int, args) -> None:
    import torch.distributed as dist

    if not run(args, group=dist.group.WORLD):
        raise RuntimeError("the tokens differ from greedy generate (see rank 0's report)")


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _check_args(parser, args)
    if args.ranks:
        from mla_dcp.testing import group_succeeds

        args.dcp = args.ranks
        ok = group_succeeds(_process_main, args.ranks, args)
    else:
        ok = run(args)
    print("\nOK" if ok else "\nFAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
