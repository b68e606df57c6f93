"""`python -m example_utils OUTPUT_DIR` (installed with the package): the closing summary of a finished run."""

import sys

from example_utils import run_summary

if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m example_utils OUTPUT_DIR")
    try:
        print(run_summary(sys.argv[1]))
    except FileNotFoundError as err:
        sys.exit(f"example_utils: error: {err}")
