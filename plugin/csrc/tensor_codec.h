// Encoding of boxed operator arguments (c10::IValue) into protocol Values,
// and back for results of the synchronous path.
//
// A flagos tensor travels as a TensorRef (its storage's device address,
// offset, sizes, strides, dtype, device); a CPU tensor travels by value as a
// HostTensor (e.g. a 0-dim scalar tensor mixed with flagos tensors).
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include "flagos/v1/flagos.pb.h"
#include "op_call_wire.h"

namespace torch_fl {

inline constexpr c10::DeviceType kFlagos = c10::DeviceType::PrivateUse1;

// A defined tensor on a flagos device.
inline bool IsFlagos(const at::Tensor& t) { return t.defined() && t.device().type() == kFlagos; }

// The device address of element 0 of `t`'s storage (0 for empty storage).
// Throws c10::AcceleratorError when the memory belongs to a lost session
// (runtime.h, CheckGeneration).
uint64_t StorageAddr(const at::Tensor& t);
// The device address of `t`'s first element.
uint64_t ElementAddr(const at::Tensor& t);

// A TensorRef's fields for `t` (undefined, or on a flagos device: anything
// else throws); its spans point into `t`. EncodeTensorRef writes them.
WireTensorRef TensorRefFieldsOf(const at::Tensor& t);
void EncodeTensorRef(const at::Tensor& t, flagos::v1::TensorRef* ref);
// Adds `value` to `wire` as EncodeValue would encode it and returns true;
// false, adding nothing, for a kind OpCallWire does not take (the caller
// then encodes the call with EncodeValue).
bool AddWireArg(const c10::IValue& value, OpCallWire* wire);
// Throws c10::Error for argument kinds the protocol cannot carry.
void EncodeValue(const c10::IValue& value, flagos::v1::Value* out);
// A result of the synchronous path; host tensors are uploaded to `device`.
// `generation`: the session the call ran in, whose held results are placed
// (Enqueue's `encoded_in`).
c10::IValue DecodeResult(const flagos::v1::Value& value, int device, uint64_t generation);

}  // namespace torch_fl
