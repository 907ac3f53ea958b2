"""cuda-python (`cuda.bindings`) and ctypes libcudart, answered from the rank's driver."""
