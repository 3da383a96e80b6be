"""torch_fl: PyTorch's PrivateUse1 device as ``"flagos"``, served by flagosd.

``import torch_fl`` registers the device; so does ``import torch`` alone
when torch_fl is installed (PyTorch's device-backend autoload: the package's
``torch.backends`` entry point names :func:`_autoload`;
``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` turns it off). The first use of a flagos
tensor connects to the daemon named by ``FLAGOS_ENDPOINT`` (see
:func:`torch_fl.endpoint`); importing connects to nothing. Every operator
then runs in the daemon.
"""
from __future__ import annotations

import atexit

import torch

from . import _endpoint
from . import _C  # registers kernels, allocator, guard and hooks
from . import device as _device_module

__all__ = ["endpoint", "daemon_stats", "daemon_info"]

__version__ = "0.1.0"

torch.utils.rename_privateuse1_backend("flagos")
torch._register_device_module("flagos", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(
    for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
)
# torch.accelerator.Graph finds the graph implementation by the device's
# name, which the rename above just gave it.
_C._register_graph_impl()

_C._set_endpoint_resolver(_endpoint.resolve)

from . import _sharing  # noqa: E402  (needs the device registered)

_sharing.install()

from . import _import_hooks  # noqa: E402

if torch.distributed.is_available():
    # The flagos c10d backend (torch_fl/distributed.py): defines the
    # flagos_c10d operators; connects to nothing.
    from . import distributed as _distributed  # noqa: E402

    _distributed.register()


def _register_with_lightning(namespace: str) -> None:
    from . import lightning

    lightning.register(namespace)


# Trainer(accelerator="flagos") in each Lightning namespace, once its Trainer
# is imported (torch_fl/lightning.py; nothing is imported here).
for _namespace in ("lightning.pytorch", "pytorch_lightning"):
    _import_hooks.when_imported(
        f"{_namespace}.trainer.connectors.accelerator_connector",
        lambda _module, _ns=_namespace: _register_with_lightning(_ns))


def _register_with_fabric(namespace: str) -> None:
    from . import lightning

    lightning.register_fabric(namespace)


# Fabric(accelerator="flagos") in each Fabric namespace, once its connector
# is imported (torch_fl/lightning.py).
for _namespace in ("lightning.fabric", "lightning_fabric"):
    _import_hooks.when_imported(
        f"{_namespace}.connector", lambda _module, _ns=_namespace: _register_with_fabric(_ns))


def _register_with_accelerate(module) -> None:
    from . import _accelerate

    _accelerate.register(module)


# A multi-process launch of Accelerate (and so of the Hugging Face Trainer)
# on flagos, once accelerate.state is imported (torch_fl/_accelerate.py).
_import_hooks.when_imported("accelerate.state", _register_with_accelerate)


def _autoload() -> None:
    """The ``torch.backends`` entry point, which ``import torch`` calls once
    it has defined what backends use (torch/__init__.py,
    ``_import_device_backends``). Loading the entry point imported this
    package, which registered the device; there is nothing more to do, and
    nothing here may connect to a daemon (none need run at ``import torch``)."""


def endpoint() -> str:
    """The daemon endpoint this process uses, connecting if needed."""
    return _C._endpoint()


def daemon_info() -> dict:
    """What the daemon reported at connection: versions, backend, devices."""
    return _C._daemon_info()


def daemon_stats(endpoint: str | None = None) -> dict:
    """Devices, memory and sessions of a daemon (``sessions``: the live ones;
    ``closing_sessions``: those whose client left while a command of theirs
    ran, holding their memory until it returned).

    With no argument, asks this process's daemon (connecting if needed);
    otherwise the daemon at ``endpoint``, without opening a session.
    """
    return _C._daemon_stats(endpoint or "")


def _shutdown() -> None:
    # Ends the session before the interpreter tears down; tensors freed later
    # are dropped locally (the daemon frees the session's memory).
    if _C._session_open():
        try:
            _C._synchronize(-1)
        except RuntimeError:
            pass
    _C._close_session()
    _endpoint.stop_private_daemon()


atexit.register(_shutdown)
