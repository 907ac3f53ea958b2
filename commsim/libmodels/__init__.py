"""Models of how other libraries behave, as commsim's own code: PyTorch's caching allocator and
its statistics, NCCL's transport and algorithm choices, the POSIX-fd exchange styles and
vLLM's CUDA-graph buffer registration."""
