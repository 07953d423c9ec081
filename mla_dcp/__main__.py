"""Command line: `python -m mla_dcp demo [...]`, `python -m mla_dcp bench [...]`."""

from __future__ import annotations

import sys

_COMMANDS = {
    "demo": ("mla_dcp.demo", "run a whole DCP verification and check it against the global reference"),
    "bench": ("mla_dcp.bench", "time one rank's verify step against the roofline (needs a CUDA GPU)"),
    "hf-demo": ("mla_dcp.hf_demo", "speculative decoding of a Hugging Face DeepSeek-V2/V3 model through mla_dcp"),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in _COMMANDS:
        lines = ["usage: python -m mla_dcp COMMAND [options]", "", "commands:"]
        lines += [f"  {name:<8} {help_text}" for name, (_, help_text) in _COMMANDS.items()]
        lines += ["", "`python -m mla_dcp COMMAND --help` documents a command's options."]
        asked = bool(argv) and argv[0] in ("-h", "--help")
        print("\n".join(lines), file=sys.stdout if asked else sys.stderr)
        if asked:
            return 0
        print("\nno command given" if not argv else f"\nunknown command {argv[0]!r}", file=sys.stderr)
        return 2
    import importlib
    module = importlib.import_module(_COMMANDS[argv[0]][0])
    return module.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
