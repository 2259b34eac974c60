"""The plain-torch implementations of kdtree's six operations (the `--backend torch` path).

They live in the package (kdtree.integrations.torch_ops) so that the transformers integration's
`backend="torch"` runs from an installed wheel too; this module keeps the example's import path.
"""
from kdtree.integrations.torch_ops import *  # noqa: F401,F403
from kdtree.integrations.torch_ops import TreeBuildResult, gumbel_noise  # noqa: F401
