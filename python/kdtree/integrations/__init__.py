"""Integrations of kdtree with other libraries. Each submodule imports its library only when used, so
`import kdtree` never needs them: `kdtree.integrations.transformers` (Hugging Face transformers 5.x)."""


def load_ops(backend: str):
    """kdtree's six operations as one namespace: "kdtree" (the package, GPU kernels) or "torch" (their
    plain-torch versions, kdtree.integrations.torch_ops, which run on the CPU)."""
    if backend == "torch":
        from . import torch_ops
        return torch_ops
    if backend == "kdtree":
        import kdtree
        return kdtree
    raise ValueError(f"backend must be 'kdtree' or 'torch', got {backend!r}")
