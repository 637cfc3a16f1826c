"""What every stage shares: artifacts, input specs, model and data loading, errors, configs.

Imports nothing heavy at package import (the CLI's ``--help`` must not import torch).
"""
