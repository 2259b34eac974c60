"""When the plain functions may call the CUDA implementation directly instead of through the dispatcher.

Going through torch.ops costs several microseconds of host time per call; it is only needed when torch
must see the operator: while torch.compile traces (dynamo/fake tensors), under a dispatch mode
(FakeTensorMode, opcheck, functionalization) or for tensor subclasses. Plain eager calls, which includes
CUDA-graph capture, take the direct path; both paths run the same code.
"""

import torch

try:
    _is_compiling = torch.compiler.is_compiling
except AttributeError:  # pragma: no cover - older torch
    def _is_compiling():
        return False

_dispatch_stack_len = getattr(torch._C, "_len_torch_dispatch_stack", lambda: 0)

