"""Compression techniques: quantization, pruning, distillation, and the shared trainer."""
