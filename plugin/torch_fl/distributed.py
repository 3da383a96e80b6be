"""torch.distributed on flagos tensors: the ``flagos`` c10d backend.

``import torch_fl`` registers it for the flagos device, so that
``init_process_group()`` with no backend, ``init_process_group("flagos")``
and ``init_process_group("cpu:gloo,flagos:flagos")`` all give a process
group whose collectives on flagos tensors run in flagosd (docs/distributed.md).

A collective is an operator of the ``flagos_c10d`` namespace, queued like
any other operator: it runs in the daemon in order with the work before and
after it on the tensor's current stream, on the tensors' device memory, and
no tensor byte passes through this process. A rank's collectives run in the
order the program called them, whichever streams it called them on (FSDP2
all-gathers on one stream and reduce-scatters on another): a collective that
follows one issued on another stream first makes its stream wait for that
one's, so the k-th collective of every rank is the same one. Sends run on a
stream of the group's own per device (after the current stream's work; the
current stream waits for them only at ``work.wait()``), so that a rank's
recv queued after its send is not held behind a send that waits for its
peer's recv: ``batch_isend_irecv`` rings and isend/irecv pairs complete
in any order, as on NCCL. The daemon forms the
communicator from the sessions of the ranks (the key rank 0 publishes in
the c10d Store) and runs each collective once every rank reached it.
Collectives on CPU tensors go to a gloo process group over the same Store.

When the ranks are sessions of different daemons (several nodes, or a
private daemon per rank), each rank's daemon joins the group through gloo
(torch's ProcessGroupGloo inside flagosd), meeting the others in the c10d
TCPStore the group was formed on; the collectives then run between the
daemons over TCP, still on the daemons' memory. recv from any source is
refused naming what to use instead.
"""
from __future__ import annotations

import datetime
import os
import socket
import uuid
import weakref

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future
from torch.futures import Future

from . import _C

NAME = "flagos"

# The operators flagosd defines (daemon/collectives/collective_ops.cc), the
# same schemas: the daemon's schema match refuses a client whose differ.
_SCHEMAS = {
    "all_reduce_": "all_reduce_(Tensor(a!) self, str comm, int rank, int nranks, int reduce_op, "
                   "float timeout_s) -> Tensor(a!)",
    "broadcast_": "broadcast_(Tensor(a!) self, str comm, int rank, int nranks, int root, "
                  "float timeout_s) -> Tensor(a!)",
    "all_gather_into_tensor_": "all_gather_into_tensor_(Tensor(a!) out, Tensor input, str comm, "
                               "int rank, int nranks, float timeout_s) -> Tensor(a!)",
    "reduce_scatter_tensor_": "reduce_scatter_tensor_(Tensor(a!) out, Tensor input, str comm, "
                              "int rank, int nranks, int reduce_op, float timeout_s) -> Tensor(a!)",
    "all_to_all_single_": "all_to_all_single_(Tensor(a!) out, Tensor input, int[] output_splits, "
                          "int[] input_splits, str comm, int rank, int nranks, "
                          "float timeout_s) -> Tensor(a!)",
    "send_": "send_(Tensor self, str comm, int rank, int nranks, int dst, int tag, "
             "float timeout_s) -> ()",
    "recv_": "recv_(Tensor(a!) self, str comm, int rank, int nranks, int src, int tag, "
             "float timeout_s) -> Tensor(a!)",
    "destroy_communicator": "destroy_communicator(Tensor anchor, str comm, int rank) -> ()",
    "join_group": "join_group(Tensor anchor, str comm, int rank, int nranks, str store_host, "
                  "int store_port, float timeout_s) -> ()",
}

_library = torch.library.Library("flagos_c10d", "DEF")
for _schema in _SCHEMAS.values():
    _library.define(_schema)
_ops = torch.ops.flagos_c10d


# Meta kernels: each collective writes its first argument in place (or
# nothing), so the client infers its results without asking the daemon and
# queues it on the tensor's stream like any other operator, instead of
# waiting for it (a call without a meta kernel is run synchronously, and a
# synchronous call cannot take the native route over device memory).
def _returns_first(first, *args):
    return first


def _returns_nothing(*args):
    return None


for _name, _schema in _SCHEMAS.items():
    _library.impl(_name, _returns_nothing if _schema.endswith("-> ()") else _returns_first, "Meta")

# c10d's ReduceOp::RedOpType values, which the daemon takes.
_REDUCE_OPS = {
    dist.ReduceOp.SUM: 0, dist.ReduceOp.AVG: 1, dist.ReduceOp.PRODUCT: 2,
    dist.ReduceOp.MIN: 3, dist.ReduceOp.MAX: 4, dist.ReduceOp.BAND: 5,
    dist.ReduceOp.BOR: 6, dist.ReduceOp.BXOR: 7,
}


def _reduce_op(opts):
    """The daemon's reduce op for `opts`, and premul_sum's factor (else None):
    premul_sum is a sum of the inputs each multiplied by the factor first."""
    op = getattr(opts, "reduceOp", dist.ReduceOp.SUM)
    if op == dist.ReduceOp.PREMUL_SUM:
        return _REDUCE_OPS[dist.ReduceOp.SUM], op.factor
    for known, value in _REDUCE_OPS.items():
        if op == known:
            return value, None
    raise RuntimeError(
        f"flagos process group: reduce op {op} is not supported on flagos tensors "
        "(sum, avg, product, min, max, band, bor, bxor and premul_sum are)")


def _premultiplied(t: torch.Tensor, factor, in_place: bool) -> torch.Tensor:
    if factor is None:
        return t
    return t.mul_(factor) if in_place else t * factor


def _done(result) -> dist.Work:
    # The collective is queued on the tensor's stream, in order with what
    # follows: the result is ready for every later use of the tensor.
    # Errors surface at the next synchronisation, as with any operator.
    future = Future()
    future.set_result(result)
    return _create_work_from_future(future)


class _SendWork(dist._Work):
    """A send queued on the group's send stream: ``wait()`` makes the
    current stream wait for it (the bytes were read; the tensor may be
    written again), as a NCCL work does; the host never blocks."""

    def __init__(self, tensors, sent: torch.Event) -> None:
        super().__init__()
        self._tensors = tensors
        self._sent = sent

    def wait(self, timeout=None) -> bool:
        torch.flagos.current_stream(self._sent.device.index).wait_event(self._sent)
        return True

    def is_completed(self) -> bool:
        return self._sent.query()

    def is_success(self) -> bool:
        return self._sent.query()

    def get_future(self) -> Future:
        future = Future()
        future.set_result(self._tensors)
        return future


def _device_index(tensor: torch.Tensor) -> int:
    index = tensor.device.index
    return index if index is not None else torch.flagos.current_device()


def _all_on(tensors, device_type: str) -> bool:
    return all(t.device.type == device_type for t in tensors)


class ProcessGroupFlagos(dist.ProcessGroup):
    """A process group whose collectives on flagos tensors run in flagosd
    and whose collectives on CPU tensors run in gloo."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta):
        super().__init__(rank, size)
        self._rank = rank
        self._size = size
        self._group_name = ""
        self._group_desc = ""
        self._timeout_s = timeout.total_seconds() if timeout else 1800.0
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo", store), rank, size, timeout)
        self._anchor = None
        self._finalizer = None
        self._last_streams = {}  # device index -> the stream of this group's last collective
        self._send_streams = {}  # device index -> this group's stream for sends
        self._comm = self._rendezvous(store)
        if self._finalizer is None:
            self._finalizer = weakref.finalize(self, ProcessGroupFlagos._destroy, self._comm, rank,
                                               [None])

    def _rendezvous(self, store) -> str:
        # Rank 0 names the communicator; every rank says which daemon
        # session it is. When all are sessions of one daemon, its
        # communicators form the group at the first collective; else (each
        # rank sees it alike) every rank's daemon joins it through gloo now.
        if self._rank == 0:
            store.set("flagos/comm", f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}")
        self._session = _C._session_id()
        self._generation = _C._session_generation()
        me = f"{socket.gethostname()}/{os.getpid()}/{self._session}"
        store.set(f"flagos/session/{self._rank}", me)
        comm = store.get("flagos/comm").decode()
        peers = [store.get(f"flagos/session/{r}").decode() for r in range(self._size)]
        mine = {f"{socket.gethostname()}/{s['pid']}/{s['id']}"
                for s in _C._daemon_stats("")["sessions"]}
        elsewhere = [r for r, p in enumerate(peers) if p not in mine]
        self.between_daemons = bool(elsewhere)
        if elsewhere:
            self._join_between_daemons(store, comm, elsewhere)
        return comm

    def _join_between_daemons(self, store, comm: str, elsewhere: list) -> None:
        base = getattr(store, "_underlying_non_prefix_store", store)
        if not isinstance(base, dist.TCPStore):
            raise RuntimeError(
                f"flagos process group: rank{'s' if len(elsewhere) > 1 else ''} "
                f"{', '.join(map(str, elsewhere))} use{'' if len(elsewhere) > 1 else 's'} another "
                f"flagosd than rank {self._rank} ({_C._endpoint()}), and the daemons of such a "
                f"group meet in its c10d Store, which must be a TCPStore (torchrun, or "
                f"init_method 'env://' or 'tcp://'); this group's is a {type(base).__name__} "
                "(docs/distributed.md)")
        self._anchor = torch.empty(0, device=torch.device("flagos", torch.flagos.current_device()))
        self._finalizer = weakref.finalize(self, ProcessGroupFlagos._destroy, comm, self._rank,
                                           [self._anchor])
        _ops.join_group(self._anchor, comm, self._rank, self._size, base.host, base.port,
                        self._timeout_s)
        torch.flagos.synchronize()  # the join's errors surface here, at the group's creation

    @staticmethod
    def _destroy(comm: str, rank: int, anchor: list) -> None:
        if anchor[0] is None or not _C._session_open():
            return
        try:
            _ops.destroy_communicator(anchor[0], comm, rank)
        except RuntimeError:
            pass  # the session is gone: the daemon forgets its communicators

    def _timeout(self, opts) -> float:
        t = getattr(opts, "timeout", None)
        seconds = t.total_seconds() if t is not None else -1
        return seconds if seconds > 0 else self._timeout_s

    def _flagos(self, tensors, what: str) -> bool:
        """Whether `tensors` are flagos tensors (else CPU tensors for gloo)."""
        if _all_on(tensors, "flagos"):
            if self._anchor is None:
                self._anchor = torch.empty(0, device=tensors[0].device)
                self._finalizer.detach()
                self._finalizer = weakref.finalize(self, ProcessGroupFlagos._destroy, self._comm,
                                                   self._rank, [self._anchor])
            return True
        if _all_on(tensors, "cpu"):
            return False
        devices = sorted({str(t.device) for t in tensors})
        raise RuntimeError(f"flagos process group: {what} of tensors on {', '.join(devices)}: "
                           "a collective takes flagos tensors or CPU tensors, not a mix")

    def _after_last_collective(self, tensor: torch.Tensor) -> None:
        """Call before issuing a collective on the current stream: it then
        runs after this group's previous collective on the device, so a
        rank's collectives run in the daemon in the order the program called
        them, whatever streams it called them on (FSDP2 all-gathers on one
        and reduce-scatters on another), as its peers' do; the daemon matches
        a rank's k-th collective with its peers' k-th. When the previous one
        was on another stream, the current stream first waits for that
        stream's work so far; on the same stream (DDP, most programs) the
        stream's order suffices and nothing is sent."""
        index = _device_index(tensor)
        current = torch.flagos.current_stream(index)
        last = self._last_streams.get(index)
        if last is not None and last != current:
            current.wait_stream(last)
        self._last_streams[index] = current

    def _args(self, opts):
        if _C._session_generation() != self._generation:
            # The daemon restarted (or crashed): its communicators went with
            # the session, and the peers may have run a different number of
            # collectives before; meeting again in the new daemon could pair
            # a rank's k-th collective with another's (k+1)-th.
            raise RuntimeError(
                f"flagos process group: rank {self._rank}'s session {self._session} with flagosd "
                f"({_C._endpoint()}), which the group was formed on, was lost (the daemon "
                "restarted or crashed), and the process group ended with it; restart the job "
                "(or dist.destroy_process_group() and form a new group on every rank; "
                "docs/distributed.md)")
        return self._comm, self._rank, self._size, self._timeout(opts)

    def getBackendName(self) -> str:
        return NAME

    # c10d keeps a group's name and description in its backends; this group
    # is its own backend, so it keeps them (DeviceMesh, FSDP2 and the
    # functional collectives find groups by name).
    def getGroupName(self) -> str:
        return self._group_name

    def setGroupName(self, name: str) -> None:
        self._group_name = name

    def getGroupDesc(self) -> str:
        return self._group_desc

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc

    # This group is its own backend for every device, also for c10d's
    # Python callers (init_process_group(device_id=...) asks the device's
    # backend whether it splits).
    def _get_backend(self, device=None) -> "ProcessGroupFlagos":
        return self

    @property
    def supports_splitting(self) -> bool:
        return False

    def eager_connect_single_device(self, device=None) -> None:
        pass  # the communicator forms at the first collective

    def size(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"ProcessGroupFlagos(rank={self._rank}, size={self._size})"

    # Collectives. opts are c10d's option structs.

    def broadcast(self, tensors, opts=None):
        if not self._flagos(tensors, "broadcast"):
            return self._gloo.broadcast(tensors, opts)
        comm, rank, size, timeout = self._args(opts)
        self._after_last_collective(tensors[0])
        for t in tensors:
            _ops.broadcast_(t, comm, rank, size, getattr(opts, "rootRank", 0), timeout)
        return _done(tensors)

    def allreduce(self, tensors, opts=None):
        if not self._flagos(tensors, "allreduce"):
            return self._gloo.allreduce(tensors, opts)
        op, factor = _reduce_op(opts)
        comm, rank, size, timeout = self._args(opts)
        self._after_last_collective(tensors[0])
        for t in tensors:
            _ops.all_reduce_(_premultiplied(t, factor, True), comm, rank, size, op, timeout)
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        if not self._flagos(tensors, "allreduce_coalesced"):
            return self._gloo.allreduce_coalesced(tensors, opts)
        return self.allreduce(tensors, opts)

    def barrier(self, opts=None):
        # On the current flagos device, as NCCL's barrier is an allreduce
        # on the current CUDA device.
        token = torch.ones(1, device="flagos")
        self.allreduce([token])
        token.cpu()  # waits for every rank
        return _done([token])

    def reduce(self, tensors, opts=None):
        # An allreduce whose result only the root keeps (the other ranks'
        # tensors are left as they were, as NCCL's in-place reduce does).
        if not self._flagos(tensors, "reduce"):
            return self._gloo.reduce(tensors, opts)
        op, factor = _reduce_op(opts)
        comm, rank, size, timeout = self._args(opts)
        root = getattr(opts, "rootRank", 0)
        for t in tensors:
            mine = _premultiplied(t, factor, True) if rank == root else (
                _premultiplied(t, factor, False) if factor is not None else t.clone())
            self._after_last_collective(mine)
            _ops.all_reduce_(mine, comm, rank, size, op, timeout)
        return _done(tensors)

    def gather(self, output_lists, inputs, opts=None):
        # An allgather whose blocks only the root copies out.
        flat = [t for group in output_lists for t in group] + list(inputs)
        if not self._flagos(flat, "gather"):
            return self._gloo.gather(output_lists, inputs, opts)
        root = getattr(opts, "rootRank", 0)
        for i, t in enumerate(inputs):
            gathered = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
            self._allgather_base(gathered, t.contiguous(), opts)
            if self._rank == root:
                outputs = output_lists[i]
                if len(outputs) != self._size:
                    raise RuntimeError(f"flagos gather: {len(outputs)} output tensors at the root "
                                       f"for a group of {self._size} ranks")
                for r, out in enumerate(outputs):
                    out.copy_(gathered[r])
        return _done(output_lists)

    def scatter(self, outputs, input_lists, opts=None):
        # The root's blocks broadcast as one tensor; each rank keeps its own.
        flat = list(outputs) + [t for group in input_lists for t in group]
        if not self._flagos(flat, "scatter"):
            return self._gloo.scatter(outputs, input_lists, opts)
        root = getattr(opts, "rootRank", 0)
        comm, rank, size, timeout = self._args(opts)
        for i, out in enumerate(outputs):
            if rank == root:
                if len(input_lists[i]) != size:
                    raise RuntimeError(f"flagos scatter: {len(input_lists[i])} input tensors at "
                                       f"the root for a group of {size} ranks")
                blocks = torch.stack([t.reshape(out.shape) for t in input_lists[i]])
            else:
                blocks = torch.empty((size,) + tuple(out.shape), dtype=out.dtype,
                                     device=out.device)
            self._after_last_collective(blocks)
            _ops.broadcast_(blocks, comm, rank, size, root, timeout)
            out.copy_(blocks[rank])
        return _done(outputs)

    def alltoall(self, outputs, inputs, opts=None):
        if not self._flagos(list(outputs) + list(inputs), "all_to_all"):
            return self._gloo.alltoall(outputs, inputs, opts)
        if len(outputs) != self._size or len(inputs) != self._size:
            raise RuntimeError(f"flagos all_to_all: {len(inputs)} inputs and {len(outputs)} "
                               f"outputs for a group of {self._size} ranks")
        # One all_to_all of the flattened tensors, split by their sizes.
        send = torch.cat([t.reshape(-1) for t in inputs])
        received = torch.empty(sum(t.numel() for t in outputs), dtype=send.dtype,
                               device=send.device)
        self._after_last_collective(send)
        _ops.all_to_all_single_(received, send, [t.numel() for t in outputs],
                                [t.numel() for t in inputs], *self._args(opts))
        for out, block in zip(outputs, received.split([t.numel() for t in outputs])):
            out.copy_(block.view(out.shape))
        return _done(outputs)

    def allgather(self, output_lists, inputs, opts=None):
        flat = [t for group in output_lists for t in group] + list(inputs)
        if not self._flagos(flat, "allgather"):
            return self._gloo.allgather(output_lists, inputs, opts)
        for outputs, t in zip(output_lists, inputs):
            if len(outputs) != self._size:
                raise RuntimeError(f"flagos allgather: {len(outputs)} output tensors for a group "
                                   f"of {self._size} ranks")
            gathered = torch.empty((self._size,) + tuple(t.shape), dtype=t.dtype, device=t.device)
            self._allgather_base(gathered, t, opts)
            for r, out in enumerate(outputs):
                out.copy_(gathered[r])
        return _done(output_lists)

    def _allgather_base(self, output, input, opts=None):
        if not self._flagos([output, input], "all_gather_into_tensor"):
            return self._gloo._allgather_base(output, input, opts)
        self._after_last_collective(output)
        _ops.all_gather_into_tensor_(output, input, *self._args(opts))
        return _done([output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self._allgather_base(out, t, opts)
        return _done(outputs)

    def reduce_scatter(self, outputs, input_lists, opts=None):
        flat = list(outputs) + [t for group in input_lists for t in group]
        if not self._flagos(flat, "reduce_scatter"):
            return self._gloo.reduce_scatter(outputs, input_lists, opts)
        for out, inputs in zip(outputs, input_lists):
            if len(inputs) != self._size:
                raise RuntimeError(f"flagos reduce_scatter: {len(inputs)} input tensors for a "
                                   f"group of {self._size} ranks")
            self._reduce_scatter_base(out, torch.stack([t.reshape(out.shape) for t in inputs]),
                                      opts)
        return _done(outputs)

    def _reduce_scatter_base(self, output, input, opts=None):
        if not self._flagos([output, input], "reduce_scatter_tensor"):
            return self._gloo._reduce_scatter_base(output, input, opts)
        op, factor = _reduce_op(opts)
        comm, rank, size, timeout = self._args(opts)
        source = _premultiplied(input, factor, False).contiguous()
        self._after_last_collective(output)
        _ops.reduce_scatter_tensor_(output, source, comm, rank, size, op, timeout)
        return _done([output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        for out, t in zip(outputs, inputs):
            self._reduce_scatter_base(out, t, opts)
        return _done(outputs)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,
                      opts=None):
        if not self._flagos([output, input], "all_to_all_single"):
            return self._gloo.alltoall_base(output, input, output_split_sizes,
                                            input_split_sizes, opts)
        source = input.contiguous()
        received = output if output.is_contiguous() else torch.empty_like(
            output, memory_format=torch.contiguous_format)
        self._after_last_collective(received)
        _ops.all_to_all_single_(received, source, list(output_split_sizes),
                                list(input_split_sizes), *self._args(opts))
        if received is not output:
            output.copy_(received)
        return _done([output])

    def send(self, tensors, dst: int, tag: int):
        if not self._flagos(tensors, "send"):
            return self._gloo.send(tensors, dst, tag)
        comm, rank, size, timeout = self._args(None)
        index = _device_index(tensors[0])
        current = torch.flagos.current_stream(index)
        stream = self._send_streams.get(index)
        if stream is None:
            stream = self._send_streams[index] = torch.flagos.Stream(index)
        stream.wait_stream(current)
        with torch.flagos.stream(stream):
            for t in tensors:
                _ops.send_(t, comm, rank, size, dst, tag, timeout)
        for t in tensors:
            t.record_stream(stream)  # not reused before the send read it
        sent = torch.flagos.Event()
        sent.record(stream)
        return _SendWork(tensors, sent)

    def recv(self, tensors, src: int, tag: int):
        if not self._flagos(tensors, "recv"):
            return self._gloo.recv(tensors, src, tag)
        comm, rank, size, timeout = self._args(None)
        for t in tensors:
            _ops.recv_(t, comm, rank, size, src, tag, timeout)
        return _done(tensors)

    def recv_anysource(self, tensors, tag: int):
        if not self._flagos(tensors, "recv"):
            return self._gloo.recv_anysource(tensors, tag)
        raise RuntimeError("flagos process group: recv from any source is not supported on "
                           "flagos tensors (it is not on NCCL either); name the source rank")


def _create(store, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupFlagos:
    return ProcessGroupFlagos(store, rank, size, timeout)


def register() -> None:
    """Registers the ``flagos`` c10d backend for the flagos device (idempotent)."""
    if NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(NAME, _create, devices=["flagos"])


# torch 2.13's names for the single-tensor collectives (distributed_c10d
# calls them on the group from Python).
ProcessGroupFlagos.all_gather_single = ProcessGroupFlagos._allgather_base
ProcessGroupFlagos.reduce_scatter_single = ProcessGroupFlagos._reduce_scatter_base
ProcessGroupFlagos.all_to_all_single = ProcessGroupFlagos.alltoall_base
ProcessGroupFlagos.all_gather_single_coalesced = ProcessGroupFlagos.allgather_into_tensor_coalesced
ProcessGroupFlagos.reduce_scatter_single_coalesced = (
    ProcessGroupFlagos.reduce_scatter_tensor_coalesced)
