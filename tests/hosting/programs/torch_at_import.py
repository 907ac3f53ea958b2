"""A module of a program that runs a torch operation when imported (a table built at import):
the procs-mode zygote must not fork after importing it."""

import torch

TABLE = torch.arange(4)
