"""Adapters for the trainers people already have: PyTorch Lightning and Hugging Face.

Each module imports its library on use only; install it with ``pip install
sweeps[lightning]`` or ``sweeps[huggingface]``.
"""

__all__ = ["huggingface", "lightning"]  # modules: each imports its library
