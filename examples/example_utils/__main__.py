"""`python -m example_utils OUTPUT_DIR` (with `examples/` on `PYTHONPATH`): the closing summary of a finished run."""

import sys

from example_utils import run_summary

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m example_utils OUTPUT_DIR")
    try:
        print(run_summary(sys.argv[1]))
    except FileNotFoundError as err:
        sys.exit(f"example_utils: error: {err}")
