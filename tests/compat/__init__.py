"""Compatibility suite: torchvision, timm and Hugging Face transformers models through every stage."""
