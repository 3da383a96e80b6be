#include "protocol/command_addresses.h"

namespace flagos::daemon {
namespace {

using Visit = absl::FunctionRef<void(int device, uint64_t& addr)>;

void VisitRef(v1::TensorRef& ref, Visit visit) {
  uint64_t addr = ref.addr();
  visit(ref.device(), addr);
  ref.set_addr(addr);
}

void VisitValue(v1::Value& value, Visit visit) {
  if (value.has_tensor()) {
    VisitRef(*value.mutable_tensor(), visit);
  } else if (value.has_list()) {
    for (v1::Value& element : *value.mutable_list()->mutable_values()) VisitValue(element, visit);
  }
}

// The `addr` field of a command's payload, checked on `device`.
template <typename Message>
void VisitField(Message& message, int device, Visit visit) {
  uint64_t addr = message.addr();
  visit(device, addr);
  message.set_addr(addr);
}

}  // namespace

void ForEachDeviceAddress(v1::Command& command, Visit visit) {
  const int device = command.device();
  switch (command.kind_case()) {
    case v1::Command::kOp:
      for (v1::Value& arg : *command.mutable_op()->mutable_args()) VisitValue(arg, visit);
      for (v1::TensorRef& out : *command.mutable_op()->mutable_outputs()) VisitRef(out, visit);
      break;
    case v1::Command::kPlaceResult:
      VisitRef(*command.mutable_place_result()->mutable_dst(), visit);
      break;
    case v1::Command::kFree:
      VisitField(*command.mutable_free(), device, visit);
      break;
    case v1::Command::kCopyToDevice:
      VisitField(*command.mutable_copy_to_device(), device, visit);
      break;
    case v1::Command::kCopyFromDevice:
      VisitField(*command.mutable_copy_from_device(), device, visit);
      break;
    case v1::Command::kMemset:
      VisitField(*command.mutable_memset(), device, visit);
      break;
    case v1::Command::kExportMemory:
      VisitField(*command.mutable_export_memory(), device, visit);
      break;
    case v1::Command::kReleaseImport:
      VisitField(*command.mutable_release_import(), device, visit);
      break;
    case v1::Command::kQueryExport:
      VisitField(*command.mutable_query_export(), device, visit);
      break;
    case v1::Command::kCopyDeviceToDevice: {
      v1::CopyDeviceToDevice& copy = *command.mutable_copy_device_to_device();
      uint64_t src = copy.src();
      visit(copy.src_device(), src);
      copy.set_src(src);
      uint64_t dst = copy.dst();
      visit(device, dst);
      copy.set_dst(dst);
      break;
    }
    case v1::Command::kDefineGraph:
      for (v1::Command& captured : *command.mutable_define_graph()->mutable_commands()) {
        ForEachDeviceAddress(captured, visit);
      }
      break;
    default:
      break;
  }
}

}  // namespace flagos::daemon
