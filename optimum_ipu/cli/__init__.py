"""The `optimum-ipu` command and its subcommands (`env`, `config check`, `benchmark`), the top layer of the package.

`main` is the console entry point (`optimum-ipu = "optimum_ipu.cli:main"`); `python -m optimum_ipu.cli` runs it too.
The benchmark (`optimum_ipu.cli.benchmark`) and its packing workload (`optimum_ipu.cli.benchmark_packing`) live
here, so the library below imports neither matplotlib nor tqdm.
"""

from .main import main

__all__ = ["main"]
