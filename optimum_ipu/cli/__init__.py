"""The `optimum-ipu` command and its subcommands (`env`, `config check`, `benchmark`, `plot`), the top layer.

`main` is the console entry point (`optimum-ipu = "optimum_ipu.cli:main"`); `python -m optimum_ipu.cli` runs it too.
The benchmark (`optimum_ipu.cli.benchmark`) and its packing workload (`optimum_ipu.cli.benchmark_packing`) live
here, and so does `optimum_ipu.cli.plot` (`training_curves.png`, which the example scripts draw): the library below
imports neither matplotlib nor tqdm, and `plot` imports matplotlib only when it draws.
"""

from .main import main

__all__ = ["main"]
