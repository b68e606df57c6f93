"""Errors raised by optimum-ipu. Imports nothing heavy, so every layer can use them."""


class IncompatibleIPUConfigError(ValueError):
    """An `IPUConfig` (or a field of it) that is malformed or does not fit the model or the machine.

    The message names the field, the value given and what is allowed.
    """
