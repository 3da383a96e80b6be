"""Lightning on flagos: ``Trainer(accelerator="flagos", devices=N)``.

:func:`accelerator_class` is the flagos ``Accelerator`` of a Lightning
namespace (``lightning.pytorch``, or ``pytorch_lightning`` of the
standalone package); ``torch_fl.lightning.FlagosAccelerator`` is
``lightning.pytorch``'s. :func:`register` puts it in the namespace's
``AcceleratorRegistry`` under ``"flagos"``. ``import torch_fl`` calls it for
each namespace, at once if its Trainer is already imported, otherwise when
it gets imported (torch_fl/_import_hooks.py): Lightning (2.6) reads no entry
points for accelerators, only for callbacks, and those too late.

What Lightning leaves to the accelerator's name, :func:`register` fills in
for flagos, in the Trainer's ``_AcceleratorConnector``:

- the single-device strategy: for an accelerator it does not know, Lightning
  picks ``SingleDeviceStrategy(device="cpu")``, which would train on the
  CPU; flagos gets ``SingleDeviceStrategy`` on its chosen device;
- DDP: for several devices (or nodes) Lightning's own choice (``"ddp"``, one
  process per device), whose process group gets the ``flagos`` c10d backend
  (docs/distributed.md) instead of gloo, which has no flagos tensors;
- FSDP (``strategy="fsdp"``): Lightning refuses it for any accelerator but
  CUDA, though its FSDP strategy uses no CUDA API; flagos passes that check
  (and its process group gets the ``flagos`` backend, the device's default);
- ``precision="bf16-mixed"`` / ``"16-mixed"``: Lightning autocasts on
  ``"cuda"`` for such an accelerator; flagos gets ``torch.autocast("flagos")``.

``devices="auto"`` is one device (a process drives one unless it asks for
more: Lightning's DDP launcher starts a process per device).
"""
from __future__ import annotations

import functools
import importlib
from typing import Any

import torch

NAMESPACES = ("lightning.pytorch", "pytorch_lightning")
# The module whose import means a Trainer can be built: it holds the
# registry lookups and the strategy choice that register() completes.
CONNECTOR_MODULE = "trainer.connectors.accelerator_connector"

def _device_count() -> int:
    return torch.flagos.device_count()


def _parse_device_indices(devices: Any) -> list[int]:
    """``devices`` as Lightning accepts it (n, "n", -1, "-1", "i,j", [i, j])
    -> device indices, each checked against the daemon's devices."""
    if isinstance(devices, str):
        text = devices.strip()
        if "," in text:
            devices = [int(part) for part in text.split(",") if part.strip()]
        else:
            devices = int(text)
    if isinstance(devices, int):
        indices = list(range(_device_count())) if devices == -1 else list(range(devices))
    elif isinstance(devices, (list, tuple)):
        indices = [int(i) for i in devices]
    else:
        raise TypeError(f"flagos: Trainer(devices={devices!r}) is not a device count or a list "
                        "of device indices")
    count = _device_count()
    bad = [i for i in indices if not 0 <= i < count]
    if bad or not indices:
        raise ValueError(f"flagos: Trainer(devices={devices!r}) names no device the daemon "
                         f"serves (it serves {count}: indices 0..{count - 1}; "
                         "torch.flagos.device_count())")
    return indices


@functools.cache
def accelerator_class(namespace: str = "lightning.pytorch") -> type:
    """The flagos ``Accelerator`` subclass of ``namespace``'s Lightning."""
    accelerators = importlib.import_module(f"{namespace}.accelerators")
    exceptions = importlib.import_module(f"{namespace}.utilities.exceptions")
    misconfiguration = exceptions.MisconfigurationException

    class FlagosAccelerator(accelerators.Accelerator):
        """Lightning's accelerator for flagos devices (one per process; DDP for several)."""

        def setup_device(self, device: torch.device) -> None:
            if device.type != "flagos":
                raise misconfiguration(f"flagos: the accelerator was given device {device}, not a "
                                       "flagos device")
            torch.flagos.set_device(0 if device.index is None else device.index)

        def get_device_stats(self, device: Any) -> dict[str, Any]:
            """The caching allocator's statistics (``torch.flagos.memory_stats``)."""
            return dict(torch.flagos.memory_stats(device))

        def teardown(self) -> None:
            torch.flagos.empty_cache()

        @staticmethod
        def parse_devices(devices: Any) -> list[int]:
            try:
                return _parse_device_indices(devices)
            except (TypeError, ValueError) as e:
                raise misconfiguration(str(e)) from None

        @staticmethod
        def get_parallel_devices(devices: list[int]) -> list[torch.device]:
            return [torch.device("flagos", i) for i in devices]

        @staticmethod
        def auto_device_count() -> int:
            # devices="auto": one device; DDP when the Trainer asks for more.
            return 1

        @staticmethod
        def is_available() -> bool:
            return torch.flagos.is_available()

        @staticmethod
        def name() -> str:
            return "flagos"

        @classmethod
        def register_accelerators(cls, accelerator_registry: Any) -> None:
            accelerator_registry.register(cls.name(), cls, description=cls.__doc__)

    FlagosAccelerator.__module__ = __name__
    FlagosAccelerator.__qualname__ = "FlagosAccelerator"
    return FlagosAccelerator


def register(namespace: str = "lightning.pytorch") -> None:
    """Registers ``"flagos"`` in ``namespace``'s AcceleratorRegistry and
    completes its Trainer's choices for flagos (module docstring). Idempotent."""
    completed = _complete(namespace, "AcceleratorRegistry", CONNECTOR_MODULE,
                          "_AcceleratorConnector", "determine_ddp_device_ids",
                          ("_precision_plugin_flag", "_precision_flag"))
    if completed is None:
        return
    connector, strategies, on_flagos = completed
    check_strategy_and_fallback = connector._check_strategy_and_fallback

    @functools.wraps(check_strategy_and_fallback)
    def _check_strategy_and_fallback(self: Any) -> None:
        # Lightning refuses its FSDP strategy for any accelerator but CUDA,
        # whose device API it then does not use: FSDP on flagos runs on the
        # flagos process group backend (torch's FSDP takes the device
        # module by the device's name). The check is Lightning's only
        # objection; let it pass for flagos, nothing else.
        flag = self._strategy_flag
        fsdp = (type(flag) is strategies.FSDPStrategy or (
            isinstance(flag, str) and flag in strategies.FSDPStrategy.get_registered_strategies()))
        if not (fsdp and on_flagos(self)):
            return check_strategy_and_fallback(self)
        accelerator_flag = self._accelerator_flag
        self._accelerator_flag = "cuda"
        try:
            return check_strategy_and_fallback(self)
        finally:
            self._accelerator_flag = accelerator_flag

    connector._check_strategy_and_fallback = _check_strategy_and_fallback


def register_fabric(namespace: str = "lightning.fabric") -> None:
    """``Fabric(accelerator="flagos")``: registers the flagos accelerator in
    ``namespace``'s ACCELERATOR_REGISTRY and completes Fabric's choices for
    it, as :func:`register` does the Trainer's: one device gets
    ``SingleDeviceStrategy`` on it (Fabric picks the CPU for an accelerator
    it does not know), several get DDP on the flagos backend, and
    ``"bf16-mixed"`` / ``"16-mixed"`` autocast on flagos. Idempotent."""
    _complete(namespace, "ACCELERATOR_REGISTRY", "connector", "_Connector",
              "_determine_ddp_device_ids", ("_precision_instance", "_precision_input"))


def _complete(namespace: str, registry_name: str, connector_module: str, connector_name: str,
              device_ids_method: str, precision_attributes: tuple[str, str]) -> Any:
    """What the Trainer's and Fabric's connectors share: the accelerator in
    the registry; one device gets SingleDeviceStrategy on it; DDP gets the
    flagos backend (:func:`_ddp_on_flagos`); a mixed precision without a
    plugin autocasts on flagos. Returns (connector class, strategies module,
    on_flagos) to complete further, or None when done before."""
    accelerator = accelerator_class(namespace)
    registry = getattr(importlib.import_module(f"{namespace}.accelerators"), registry_name)
    if "flagos" not in registry:
        accelerator.register_accelerators(registry)
    connector = getattr(importlib.import_module(f"{namespace}.{connector_module}"),
                        connector_name)
    if getattr(connector, "_flagos_completed", False):
        return None
    strategies = importlib.import_module(f"{namespace}.strategies")
    precision = importlib.import_module(f"{namespace}.plugins.precision")
    plugin_attribute, precision_attribute = precision_attributes

    def on_flagos(connector_self: Any) -> bool:
        flag = connector_self._accelerator_flag
        return flag == "flagos" or isinstance(flag, accelerator)

    choose_strategy = connector._choose_strategy
    check_and_init_precision = connector._check_and_init_precision
    lazy_init_strategy = connector._lazy_init_strategy

    @functools.wraps(choose_strategy)
    def _choose_strategy(self: Any) -> Any:
        if not on_flagos(self) or self._num_nodes_flag > 1 or len(self._parallel_devices) > 1:
            return choose_strategy(self)  # "ddp" for several devices or nodes
        return strategies.SingleDeviceStrategy(device=self._parallel_devices[0])

    @functools.wraps(lazy_init_strategy)
    def _lazy_init_strategy(self: Any) -> None:
        lazy_init_strategy(self)
        if on_flagos(self) and isinstance(self.strategy, strategies.DDPStrategy):
            _ddp_on_flagos(self.strategy, device_ids_method)

    @functools.wraps(check_and_init_precision)
    def _check_and_init_precision(self: Any) -> Any:
        wanted = getattr(self, precision_attribute)
        if (on_flagos(self) and getattr(self, plugin_attribute) is None
                and wanted in ("16-mixed", "bf16-mixed")
                and type(self.strategy) in (strategies.SingleDeviceStrategy,
                                            strategies.DDPStrategy)):
            if hasattr(self, "_validate_precision_choice"):
                self._validate_precision_choice()
            return precision.MixedPrecision(wanted, "flagos")
        return check_and_init_precision(self)

    connector._choose_strategy = _choose_strategy
    connector._lazy_init_strategy = _lazy_init_strategy
    connector._check_and_init_precision = _check_and_init_precision
    connector._flagos_completed = True
    return connector, strategies, on_flagos


def _ddp_on_flagos(strategy: Any, device_ids_method: str) -> None:
    """A Lightning (or Fabric) DDP strategy on flagos devices."""
    # Lightning's default process group backend for a device that is not
    # CUDA is gloo, which has no flagos tensors.
    if strategy._process_group_backend is None:
        strategy._process_group_backend = "flagos"
    # With device ids, Lightning wraps the model in DDP inside a
    # torch.cuda.stream; DDP finds a one-device module's device itself, and
    # Lightning moves each batch to the rank's device. (A module-level
    # function: ddp_spawn pickles the strategy.)
    setattr(strategy, device_ids_method, _no_device_ids)


def _no_device_ids() -> None:
    return None


def __getattr__(name: str) -> Any:
    if name == "FlagosAccelerator":
        return accelerator_class("lightning.pytorch")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
