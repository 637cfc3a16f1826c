"""The second way to load an AOTInductor package: its compiled library run by torch's model-container
runner directly, without torch's package loader.

``torch._inductor.aoti_load_package`` hands the archive to ``torch._C._aoti.AOTIModelPackageLoader``,
which unpacks it and then creates a model-container runner for its ``.so``. Where that package loader is
what crashes (torch 2.11.0+cu130 on the GPU machine's image died with SIGSEGV inside it on every
package; the same torch loads the same packages on this CPU), the runner can still be made by hand:

1. unpack the model's folder (``data/aotinductor/<model>/``: its ``.so`` with the weights inside, and on
   CUDA its kernel binaries) into a temporary folder that lives as long as the loaded model;
2. ``AOTIModelContainerRunnerCpu(so, 1)`` or ``AOTIModelContainerRunnerCuda(so, 1, "cuda:N", folder)``;
3. call it as the package loader's model does: inputs flattened with the package's own call spec, the
   flat outputs put back into the output structure.

``ptopt.formats.aoti_files.load_package`` uses it when ``PTOPT_AOTI_LOADER=container``, or when the
package loader crashed in the child-process check and this one did not.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
import zipfile
from pathlib import Path
from typing import Any

from ptopt.core.errors import ModelLoadError


def _model_files(z: zipfile.ZipFile, model: str) -> list[str]:
    marker = f"data/aotinductor/{model}/"
    return [n for n in z.namelist() if marker in "/" + n and not n.endswith("/")]


def unpack_model(path: str | Path, model: str, into: Path) -> Path:
    """The model's folder unpacked under ``into``: the path of its ``.so``. A package that keeps its
    weights outside the library (``data/weights/``) is refused: the runner alone cannot load them."""
    with zipfile.ZipFile(path) as z:
        names = _model_files(z, model)
        libraries = [n for n in names if n.endswith(".so")]
        if len(libraries) != 1:
            raise ModelLoadError(
                f"{Path(path).name}: model {model!r} of this AOTInductor package has {len(libraries)} compiled "
                "libraries (.so), not one: it cannot be loaded without torch's package loader"
            )
        if any("/data/weights/" in "/" + n for n in z.namelist()):
            raise ModelLoadError(
                f"{Path(path).name}: this AOTInductor package keeps its weights outside its library "
                "(data/weights/): it cannot be loaded without torch's package loader"
            )
        for n in names:
            target = into / Path(n).name
            with z.open(n) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
    return into / Path(libraries[0]).name


class ContainerModel:
    """One model of a package, run by the model-container runner (module docstring); callable like the
    package loader's model. The unpacked folder is removed when the object goes."""

    def __init__(
        self, path: str | Path, model: str = "model", device: str = "cpu", single_threaded: bool = False
    ) -> None:
        import torch

        folder = Path(tempfile.mkdtemp(prefix="ptopt-aoti-"))
        self._cleanup = weakref.finalize(self, shutil.rmtree, folder, True)
        so = unpack_model(path, model, folder)
        aoti = torch._C._aoti
        if str(device).startswith("cuda"):
            runner = aoti.AOTIModelContainerRunnerCuda
            self.runner = runner(str(so), 1, str(device), str(folder), bool(single_threaded))
        else:
            self.runner = aoti.AOTIModelContainerRunnerCpu(str(so), 1)
        self.device = str(device)
        specs = self.runner.get_call_spec()
        from torch.utils import _pytree as pytree

        self.in_spec, self.out_spec = pytree.treespec_loads(specs[0]), pytree.treespec_loads(specs[1])

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import torch
        from torch.export._tree_utils import reorder_kwargs
        from torch.utils import _pytree as pytree

        # as the package loader's model calls it: keywords in the spec's order, tensors flattened
        flat = pytree.tree_leaves((args, reorder_kwargs(kwargs, self.in_spec)))
        flat = [t for t in flat if isinstance(t, torch.Tensor)]
        return pytree.tree_unflatten(self.runner.run(flat), self.out_spec)

    def eval(self) -> ContainerModel:
        return self
