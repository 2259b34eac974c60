"""The torch.library namespace `kdtree` every operator is defined in.

Each operation defines its schema here and registers its implementation for the CUDA key (and the CPU key,
so CPU tensors reach the checks and their 'expected a CUDA tensor' message) plus a fake implementation.
A plain torch.library.Library registration costs the dispatcher's redispatch only; custom_op's wrapper adds
Python autograd and checking layers per call (about 10-40 us), which the operators do not need: they
have no backward, and their arguments are checked by the implementations themselves.
"""

import torch

lib = torch.library.Library("kdtree", "DEF")  # noqa: TOR901 - kept for the life of the process
