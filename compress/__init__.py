"""Compression techniques: quantization (``ptopt.compress.quantize``), pruning, distillation, and the
shared trainer.

Importing the package does nothing else: no environment variable is set and no logger is touched.
Upstream import noise (torchao's CUDA-kernel loading on a CPU machine, torch's pytree notice about
torchao's Enums) is quieted only around the imports ptopt itself makes (``core.quiet.quiet_imports``:
the PT2E engine's torchao import, a model factory that builds a transformers model).
"""
