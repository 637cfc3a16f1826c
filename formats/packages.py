"""Files ptopt writes or reads that are packages or weights, not models a runtime executes: a
TorchServe ``.mar``, a Triton model repository, a Ray Serve application folder, a ``.safetensors``
state_dict. Their rows let every
command say what such a file is instead of failing inside a loader."""

from __future__ import annotations

from pathlib import Path

from ptopt.formats.base import Format


class Mar(Format):
    name = "mar"
    label = "TorchServe .mar"
    suffixes = (".mar",)
    loadable = False
    not_runnable = "a TorchServe .mar package; validate the artifact it packages"
    sniff_rank = 3

    def sniff(self, path: Path) -> bool:
        return path.suffix.lower() == ".mar"


class Triton(Format):
    name = "triton"
    label = "Triton model repository"
    loadable = False
    not_runnable = "a Triton model repository; validate the artifact it packages"


class RayServe(Format):
    name = "ray"
    label = "Ray Serve application folder"
    folder = True
    loadable = False
    not_runnable = "a Ray Serve application folder; validate the artifact it packages (under model/)"
    sniff_rank = 4

    def sniff(self, path: Path) -> bool:
        return path.is_dir() and (path / "ptopt_ray.json").is_file()


class StateDict(Format):
    name = "state_dict"
    label = "state_dict"
    suffixes = (".safetensors",)
    loadable = False
    not_runnable = "weights only; validate pkg.module:factory --weights FILE instead"


FORMATS = (Mar(), Triton(), RayServe(), StateDict())
