"""A libnccl that ctypes wrappers load, and the NCCL communicators it serves."""
