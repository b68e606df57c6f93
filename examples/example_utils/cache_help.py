"""`python -m example_utils.cache_help [SCRIPT ...]` (run by `make setup`): cache the `--help` of every example script
in one process (`help_cache.warm`), so that even each script's first `--help` answers in a fraction of a second."""

from __future__ import annotations

import os
import sys

from .help_cache import cache_dir, example_scripts, warm


def main(argv: list[str] | None = None) -> int:
    """`python -m example_utils.cache_help [SCRIPT ...]`: cache the help of the given scripts, by default of every
    example script of this checkout; exit 2 naming a script that does not exist, 1 when the cache is off or
    unwritable."""
    scripts = sys.argv[1:] if argv is None else argv
    scripts = scripts or example_scripts()
    missing = [script for script in scripts if not os.path.isfile(script)]
    if missing or not scripts:
        print(
            f"cache_help: error: {missing[0] if missing else 'no example scripts found'}: give script paths",
            file=sys.stderr,
        )
        return 2
    warmed = warm(scripts)
    print(f"help cached for {len(warmed)} of {len(scripts)} example scripts in {cache_dir()}")
    return 0 if len(warmed) == len(scripts) else 1


if __name__ == "__main__":
    sys.exit(main())
