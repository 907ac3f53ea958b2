"""`torch.cuda` and CUDA tensors on the CPU build of torch, for a hosted rank."""
