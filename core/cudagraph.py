"""CUDA graphs around a compiled model: one graph captured per input shape, replayed afterwards.

Small models on a big GPU are launch-bound: the GPU waits for the host to launch each kernel.
A CUDA graph records the launches of one call once and replays them with one launch. An
AOTInductor package cannot carry CUDA graphs (torch's ``compile_fx`` returns the AOT-compiled
library before Inductor's ``triton.cudagraphs`` step, which only wraps JIT-compiled code), so
``ptopt export --target aoti --device cuda --cuda-graphs`` records the wish in the package's
sidecar and its loaders (``ptopt validate``, the export's own parity check) wrap the loaded package
in :class:`CudaGraphed`, the standard stream-capture recipe of ``torch.cuda.graph``:

1. warm up on a side stream (kernels load, the allocator settles), wait for it;
2. capture one call on static input buffers into a ``torch.cuda.CUDAGraph``;
3. each later call with the same input shapes and dtypes copies the inputs into those buffers and
   replays the graph; a new shape captures a new graph ("where shapes allow": a dynamic batch
   costs one capture per batch size seen).

The outputs are the graph's static output tensors: the next replay overwrites them, so a caller
that keeps outputs across calls copies them (validate moves them to the host at once).
"""

from __future__ import annotations

from typing import Any

#: warm-up calls on a side stream before a capture (the torch.cuda.graph documentation uses 3)
WARMUP_CALLS = 3


class CudaGraphed:
    """``fn`` (a callable on CUDA tensors) captured as a CUDA graph per input signature."""

    def __init__(self, fn: Any, device: Any) -> None:
        self.fn = fn
        self.device = device
        self.graphs: dict[tuple, tuple[Any, tuple, dict, Any]] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = _signature(args, kwargs)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self.graphs[key] = self._capture(args, kwargs)
        graph, static_args, static_kwargs, out = entry
        for buf, t in zip(static_args, args, strict=True):
            buf.copy_(t)
        for name, buf in static_kwargs.items():
            buf.copy_(kwargs[name])
        graph.replay()
        return out

    def _capture(self, args: tuple, kwargs: dict) -> tuple[Any, tuple, dict, Any]:
        import torch

        static_args = tuple(t.clone() for t in args)
        static_kwargs = {k: v.clone() for k, v in kwargs.items()}
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(WARMUP_CALLS):
                    self.fn(*static_args, **static_kwargs)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = self.fn(*static_args, **static_kwargs)
        return graph, static_args, static_kwargs, out

    def eval(self) -> CudaGraphed:
        return self


def _signature(args: tuple, kwargs: dict) -> tuple:
    """Shapes and dtypes of every input: a graph replays only for exactly these."""
    items = [("", t) for t in args] + sorted(kwargs.items())
    return tuple((name, tuple(t.shape), str(t.dtype)) for name, t in items)
