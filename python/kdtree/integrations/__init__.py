"""Integrations of kdtree with other libraries. Each submodule imports its library only when used, so
`import kdtree` never needs them: `kdtree.integrations.transformers` (Hugging Face transformers 5.x)."""
