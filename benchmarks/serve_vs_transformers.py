"""`optimum-ipu serve` against `transformers serve` on the same model, same machine, same requests, one after the other.

    python benchmarks/serve_vs_transformers.py [--model FOLDER] [--requests 16] [--max-tokens 32] [--concurrency 1 8]
        [--output-dir DIR] [--json F]

Now `optimum-ipu benchmark --mode serve` (`optimum_ipu/benchmark/serve.py`, which the module docstring describes);
this script is kept for the command lines of BENCHMARKS.md's 2026-12-05 runs, with their defaults (concurrency 1 and
8, 16 requests a level, every server). It writes DIR/benchmark.json and DIR/benchmark.png, and with `--json` a copy
of the report there.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from optimum_ipu.cli import main as optimum_ipu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="a causal LM folder (default: a random 124 M GPT-2)")
    parser.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--output-dir", default="benchmark_results/serve")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    command = ["benchmark", "--mode", "serve", "--requests", str(args.requests), "--max-tokens", str(args.max_tokens)]
    command += ["--concurrency", *map(str, args.concurrency), "--output-dir", args.output_dir]
    command += ["--model", args.model] if args.model else []
    code = optimum_ipu(command)
    if code == 0 and args.json:
        shutil.copyfile(Path(args.output_dir) / "benchmark.json", args.json)
    return code


if __name__ == "__main__":
    sys.exit(main())
