"""``torch.compile(backend="inductor")`` on flagos: refused with a clear error.

Inductor generates kernels (C++, Triton) for a device type and needs a code
generator for it; flagos has none (its operators run in flagosd, one by
one). Other compile backends work: ``backend="aot_eager"`` traces forward
and backward graphs with AOTAutograd and runs their operators on flagos,
``backend="eager"`` runs the captured graphs as they are.

Inductor asks the device module of a PrivateUse1 backend for its code
generators (``torch.flagos.Scheduling``, ``PythonWrapperCodegen``,
``CppWrapperCodegen``, ``WrapperFxCodegen``) when it sets up its backends
(``init_backend_registration`` in ``torch/_inductor/codegen/common.py``).
:func:`code_generator` answers with :class:`Refused`, whose use raises
:data:`MESSAGE`, and registers the (inert) device-op overrides inductor
looks up before it builds the wrapper, so that the first thing inductor
does for a flagos graph is to raise that error rather than a ``KeyError``.
Nothing here imports inductor before inductor itself runs.
"""
from __future__ import annotations

from typing import NoReturn

MESSAGE = (
    'flagos: torch.compile(backend="inductor") does not support flagos tensors: '
    "inductor generates device kernels and has no code generator for the flagos device. "
    'Compile with backend="aot_eager" (AOTAutograd graphs, forward and backward, whose '
    'operators run on flagos) or backend="eager", or run the model uncompiled.'
)

# The names inductor asks the device module for.
CODE_GENERATOR_NAMES = frozenset(
    {"Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen"}
)


def refuse() -> NoReturn:
    raise NotImplementedError(MESSAGE)


class _RefusedType(type):
    # Inductor's first question to a device's wrapper code generator, asked
    # before it lowers the graph (compile_fx.py, _compile_fx_inner): answered
    # with the error, so that it is raised before any work and on its own
    # (not inside a LoweringException of whichever operator came first).
    @property
    def supports_caching(cls) -> bool:
        refuse()


class Refused(metaclass=_RefusedType):
    """Stands in for each of inductor's per-device code generators: asking
    it ``supports_caching``, creating one (``Scheduling(scheduler)``) or
    ``PythonWrapperCodegen.create(...)`` raises :data:`MESSAGE`."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        refuse()

    @classmethod
    def create(cls, *args: object, **kwargs: object) -> NoReturn:
        refuse()


def code_generator(name: str) -> type[Refused]:
    """The device module's answer to inductor's question for ``name`` (one
    of :data:`CODE_GENERATOR_NAMES`), asked while inductor is imported."""
    from torch._inductor.codegen import common

    if "flagos" not in common.device_op_overrides_dict:
        common.register_device_op_overrides("flagos", common.DeviceOpOverrides())
    return Refused
