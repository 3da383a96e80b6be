"""flagos tensors passed between processes, with CUDA IPC's semantics.

``torch.multiprocessing`` pickles tensors with its ``ForkingPickler``
reducers; this module adds one for flagos tensors and storages (ordinary
``pickle`` and ``torch.save`` still copy the bytes, as for CUDA). The sender
asks flagosd for a grant on the memory (``torch_fl._C._share_storage``, which
waits for the sender's earlier work on the device); the receiver, in its
own session of the same daemon, opens a storage over the same device memory
(``_open_shared_storage``): no bytes are copied, and writes on either side
are seen by the other once synchronised (an event, a queue message after
``torch.flagos.synchronize()``, or the writer's exit).

The rules are CUDA's: the sender keeps the tensor alive until the receiver
holds it (a grant whose memory is gone is refused, naming the reason); the
memory lives until every holder dropped it, and a process that dies drops
what it held. flagosd gives grants only to processes of the sender's user
(``--memory-sharing``). Use the ``spawn`` or ``forkserver`` start method: a
forked child cannot use its parent's daemon session.
"""
from __future__ import annotations

from multiprocessing.reduction import ForkingPickler

import torch
import torch.multiprocessing  # installs torch's reducers first
from torch.multiprocessing.reductions import StorageWeakRef, shared_cache, storage_from_cache

from . import _C

_DEVICE_TYPE = "flagos"
# torch's reducers, by class, which ours defer to for everything not flagos.
_torch_reducers: dict = {}


def _open_storage(grant: bytes, device: int, offset: int, nbytes: int) -> torch.UntypedStorage:
    """The storage over a grant's memory, one per (grant, offset) in this
    process (as torch does for CUDA)."""
    if nbytes == 0:
        return torch.UntypedStorage(0, device=torch.device(_DEVICE_TYPE, device))
    key = (grant, offset)
    storage = storage_from_cache(torch.UntypedStorage, key)
    if storage is not None:
        # The sender counted one receiver: claim it and drop it again, so its
        # block is not kept for a receiver that will never come.
        _C._open_shared_storage(grant, device, offset, nbytes)
        return storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage
    storage = _C._open_shared_storage(grant, device, offset, nbytes)
    shared_cache[key] = StorageWeakRef(storage)
    return storage


def _share(storage: torch.UntypedStorage) -> tuple:
    if storage.nbytes() == 0:
        return (b"", storage.device.index or 0, 0, 0)
    grant, device, offset, nbytes = _C._share_storage(storage)
    # A tensor sent to this same process comes back over this storage.
    shared_cache[(grant, offset)] = StorageWeakRef(storage)
    return (grant, device, offset, nbytes)


def rebuild_flagos_tensor(tensor_cls, handle, dtype, storage_offset, size, stride, requires_grad):
    storage = _open_storage(*handle)
    t = torch._utils._rebuild_tensor(
        torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True),
        storage_offset,
        size,
        stride,
    )
    if tensor_cls == torch.nn.parameter.Parameter:
        # Integer parameters must get requires_grad=False in the constructor.
        return torch.nn.parameter.Parameter(t, requires_grad=requires_grad)
    t.requires_grad = requires_grad
    return t


def rebuild_flagos_storage(storage_cls, handle, dtype):
    storage = _open_storage(*handle)
    if storage_cls is torch.UntypedStorage:
        return storage
    return torch.storage.TypedStorage(wrap_storage=storage, dtype=dtype, _internal=True)


def _torch_reduce(obj):
    return _torch_reducers[type(obj)](obj)


def reduce_tensor(tensor):
    if tensor.device.type != _DEVICE_TYPE or tensor.layout != torch.strided or tensor.is_nested:
        return _torch_reduce(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        # torch's own refusal, word for word.
        return _torch_reduce(tensor)
    torch.utils.hooks.warn_if_has_hooks(tensor)
    return (
        rebuild_flagos_tensor,
        (
            type(tensor),
            _share(tensor.untyped_storage()),
            tensor.dtype,
            tensor.storage_offset(),
            tensor.size(),
            tensor.stride(),
            tensor.requires_grad,
        ),
    )


def reduce_storage(storage):
    untyped = storage._untyped_storage if isinstance(storage, torch.TypedStorage) else storage
    if untyped.device.type != _DEVICE_TYPE:
        return _torch_reduce(storage)
    dtype = storage.dtype if isinstance(storage, torch.TypedStorage) else torch.uint8
    return (rebuild_flagos_storage, (type(storage), _share(untyped), dtype))


def install() -> None:
    """Puts these reducers in front of torch.multiprocessing's (which
    torch installs for every tensor and storage class at import)."""
    ours = {
        torch.Tensor: reduce_tensor,
        torch.nn.parameter.Parameter: reduce_tensor,
        torch.UntypedStorage: reduce_storage,
        torch.storage.TypedStorage: reduce_storage,
    }
    for cls, reducer in ours.items():
        current = ForkingPickler._extra_reducers.get(cls)
        if current is reducer:
            continue  # installed already
        _torch_reducers[cls] = current or (lambda obj: obj.__reduce_ex__(4))
        ForkingPickler.register(cls, reducer)
