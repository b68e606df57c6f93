"""The `optimum-ipu` command and its subcommands (`env`, `config check`, `benchmark`, `plot`), the top layer.

`main` is the console entry point (`optimum-ipu = "optimum_ipu.cli:main"`); `python -m optimum_ipu.cli` runs it too.
`benchmark` dispatches to the harness, the package `optimum_ipu.benchmark` (the layer just below this one), which it
imports only when the command runs. `optimum_ipu.cli.plot` (`training_curves.png`, which the example scripts draw)
lives here: the library below the command and its harness imports neither matplotlib nor tqdm, and `plot` imports
matplotlib only when it draws.
"""

from .main import main

__all__ = ["main"]
