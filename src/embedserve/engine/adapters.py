"""The LoRA adapters an engine serves, by name: loaded at start (--lora-modules) or while it
runs (the server's admin routes), listed, unloaded. A request carries its adapter object, so an
adapter unloaded while its requests run finishes them with its own weights; new requests can no
longer name it. `view` gives the Engine whose requests run an adapter."""

from __future__ import annotations

import copy
import threading
from typing import Protocol, TypeVar

import torch
from torch import nn

from embedserve.errors import InvalidInputError, ModelLoadError
from embedserve.lora.adapter import LoraAdapter
from embedserve.lora.peft_files import read_peft
from embedserve.lora.settings import LoraSettings, check_name
from embedserve.models.lora_linear import enable_lora
from embedserve.models.lora_targets import UNUSED_BY_EMBEDDINGS, build_adapter, merge, routed


class UnknownAdapterError(InvalidInputError):
    """A name that is not a served adapter (the server answers 404)."""


class Adapters:
    def __init__(
        self, model: nn.Module, settings: LoraSettings, device: torch.device, task: str = "embed"
    ) -> None:
        self.settings = settings
        self._unused = UNUSED_BY_EMBEDDINGS if task == "embed" else ()  # modules no vector reads
        self._model = model
        self._device = device
        self._lock = threading.Lock()
        self._loaded: dict[str, LoraAdapter] = {}  # replaced, never changed: readers need no lock
        # --merge-lora: the adapter whose updates are in the weights (no update of its own to run)
        self.merged: LoraAdapter | None = None

    @classmethod
    def prepare(cls, model: nn.Module, settings: LoraSettings, device: torch.device, task: str) -> Adapters:
        """Before the weights are packed: merge the one adapter (--merge-lora), or make the
        projections apply adapters' updates; then load --lora-modules."""
        routed(model)  # an architecture adapters do not cover fails here, by name
        adapters = cls(model, settings, device, task)
        if settings.merge:
            ((name, path),) = settings.modules
            files = read_peft(path, settings.max_rank)
            merge(model, files, adapters._unused)
            adapters.merged = LoraAdapter(name, str(path), files.rank, files.fingerprint, {})
            return adapters
        enable_lora(model)
        return adapters

    def load_initial(self) -> None:
        if not self.settings.merge:
            for name, path in self.settings.modules:
                self.load(name, path)

    def load(self, name: str, path: str) -> LoraAdapter:
        """Read, check and place the adapter at `path` under `name`; ModelLoadError saying why not."""
        try:
            check_name(name)
        except ValueError as e:
            raise ModelLoadError(str(e)) from None
        if self.merged is not None:
            raise ModelLoadError(
                f"this engine serves adapter {self.merged.name} merged into its weights (--merge-lora): "
                "it loads no other"
            )
        files = read_peft(path, self.settings.max_rank)  # outside the lock: it reads files
        adapter = build_adapter(name, files, self._model, self._device, self._unused)
        with self._lock:
            if name in self._loaded:
                raise ModelLoadError(f"adapter {name!r} is already loaded; unload it first")
            if len(self._loaded) >= self.settings.max_loras:
                raise ModelLoadError(
                    f"{len(self._loaded)} adapters are loaded, the --max-loras limit: unload one first"
                )
            self._loaded = {**self._loaded, name: adapter}
        return adapter

    def replace(self, name: str, path: str) -> LoraAdapter:
        """The adapter loaded as `name` replaced by the one at `path`, checked first: on any
        refusal the old one stays. Requests queued for the old one finish with it."""
        self.get(name)
        adapter = build_adapter(
            name, read_peft(path, self.settings.max_rank), self._model, self._device, self._unused
        )
        with self._lock:
            self.get(name)  # not unloaded meanwhile
            self._loaded = {**self._loaded, name: adapter}
        return adapter

    def adopt(self, adapters: list[LoraAdapter]) -> None:
        """Serve exactly `adapters` (built for the same model: an engine rebuilt after its loop
        died keeps what the old one served, as loaded, replaced and unloaded at run time)."""
        with self._lock:
            self._loaded = {a.name: a for a in adapters}

    def unload(self, name: str) -> LoraAdapter:
        with self._lock:
            adapter = self.get(name)
            self._loaded = {k: v for k, v in self._loaded.items() if k != name}
        return adapter

    def get(self, name: str) -> LoraAdapter:
        adapter = self._loaded.get(name)
        if adapter is None:
            served = ", ".join(sorted(self._loaded)) or "none"
            raise UnknownAdapterError(f"no LoRA adapter named {name[:120]!r} is loaded (loaded: {served})")
        return adapter

    def all(self) -> list[LoraAdapter]:
        return list(self._loaded.values())


class Viewable(Protocol):
    """What `view` changes on an Engine (engine/engine.py), named here so this module does not
    import the engine that imports it."""

    name: str
    adapter: LoraAdapter | None
    adapters: Adapters | None


E = TypeVar("E", bound=Viewable)


def view(engine: E, adapter: LoraAdapter) -> E:
    """`engine` whose requests run `adapter` (the same loop, model and queue; errors name it)."""
    out = copy.copy(engine)
    out.adapter, out.name = adapter, adapter.name
    return out


def adapter_view(engine: E, name: str) -> E:
    """`view` of the adapter loaded as `name`; UnknownAdapterError naming the loaded ones."""
    if engine.adapters is None:
        raise UnknownAdapterError(f"engine {engine.name} serves no LoRA adapter (enable_lora is off)")
    return view(engine, engine.adapters.get(name))
