"""The engine: the only layer that touches devices, torch.distributed, autocast and torch.compile."""
