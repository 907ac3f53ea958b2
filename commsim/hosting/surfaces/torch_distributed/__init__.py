"""`torch.distributed` and PyTorch symmetric memory for a hosted rank."""
