// torch_fl._C: the Python binding of the flagos runtime. Importing it
// registers the PrivateUse1 kernels, allocator, guard and hooks (static
// registrations in the other files of this library).
#include <Python.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>
#include <pybind11/functional.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <torch/csrc/Generator.h>
#include <torch/csrc/Storage.h>
#include <torch/csrc/autograd/python_variable.h>

#include <google/protobuf/util/message_differencer.h>

#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "composite_forwarding.h"
#include "device_allocator.h"
#include "generator.h"
#include "graph_capture.h"
#include "pinned_allocator.h"
#include "flagos/client/connection.h"
#include "runtime.h"
#include "shape_inference.h"
#include "sharing.h"
#include "tensor_codec.h"

namespace py = pybind11;

namespace torch_fl {

void RegisterHooks();  // hooks.cpp
void RegisterGraphImpl();  // graph.cpp
c10::MempoolId_t NewGraphPoolHandle();  // graph.cpp

namespace {

py::dict DeviceDict(const flagos::v1::DeviceInfo& d) {
  py::dict out;
  out["index"] = d.index();
  out["name"] = d.name();
  out["total_memory"] = d.total_memory();
  out["used_memory"] = d.used_memory();
  out["capabilities"] = std::vector<std::string>(d.capabilities().begin(), d.capabilities().end());
  out["gaps"] = std::vector<std::string>(d.gaps().begin(), d.gaps().end());
  return out;
}

py::dict StatsDict(const flagos::v1::GetStatsResponse& stats) {
  py::dict out;
  out["backend"] = stats.backend();
  out["torch_version"] = stats.torch_version();
  out["sessions_total"] = stats.sessions_total();
  py::list devices;
  for (const auto& d : stats.devices()) devices.append(DeviceDict(d));
  out["devices"] = devices;
  const auto session_dict = [](const flagos::v1::SessionInfo& s) {
    py::dict session;
    session["id"] = s.id();
    session["pid"] = s.pid();
    session["uid"] = s.uid();
    session["gid"] = s.gid();
    // pid, uid and gid are the kernel's (a unix-socket session); else the
    // pid is the client's word and uid and gid are unknown.
    session["credentials_from_kernel"] = s.credentials_from_kernel();
    session["client"] = s.client();
    session["torch_version"] = s.torch_version();
    session["segment_bytes"] = s.segment_bytes();
    session["segments"] = s.segments();
    session["commands"] = s.commands();
    session["stream_bytes_received"] = s.stream_bytes_received();
    session["stream_bytes_sent"] = s.stream_bytes_sent();
    session["staged_bytes"] = s.staged_bytes();
    session["staging_attached"] = s.staging_attached();
    session["sync_channel_attached"] = s.sync_channel_attached();
    session["sync_bytes_received"] = s.sync_bytes_received();
    session["sync_bytes_sent"] = s.sync_bytes_sent();
    session["sync_requests"] = s.sync_requests();
    session["pinned_bytes"] = s.pinned_bytes();
    session["pinned_registered_bytes"] = s.pinned_registered_bytes();
    session["imported_segments"] = s.imported_segments();
    session["imported_bytes"] = s.imported_bytes();
    session["running_commands"] = s.running_commands();
    return session;
  };
  py::list sessions;
  for (const auto& s : stats.sessions()) sessions.append(session_dict(s));
  out["sessions"] = sessions;
  // Sessions whose client left while a command of theirs ran: they hold
  // their segments (counted in used_memory) until it returned.
  py::list closing;
  for (const auto& s : stats.closing_sessions()) closing.append(session_dict(s));
  out["closing_sessions"] = closing;
  return out;
}

flagos::v1::GetStatsResponse DaemonStats(const std::string& endpoint) {
  if (endpoint.empty()) return ValueOrThrow(Session().GetStats());
  return ValueOrThrow(flagos::client::QueryStats(endpoint, absl::Seconds(5)));
}

// Deliberately malformed commands, for tests of the daemon's validation.
void TestBadCommand(const std::string& kind) {
  flagos::v1::Command command;
  command.set_device(0);
  if (kind == "address_outside_segments") {
    auto* copy = command.mutable_copy_from_device();
    copy->set_addr(0x1000);
    copy->set_nbytes(64);
  } else if (kind == "unknown_op_id") {
    auto* op = command.mutable_op();
    op->set_op_id(0x7ffffff0);
    op->set_want_values(true);
  } else if (kind == "malformed_tensor_ref") {
    auto* op = command.mutable_op();
    op->set_op_id(OpId("aten::abs", ""));
    op->set_want_values(true);
    auto* ref = op->add_args()->mutable_tensor();
    ref->set_addr(0x1000);
    ref->add_sizes(4);
    ref->add_sizes(4);
    ref->add_strides(1);  // two sizes, one stride
    ref->set_dtype(static_cast<int32_t>(c10::ScalarType::Float));
  } else if (kind == "resize_empty") {
    // A raw aten::resize_ of a zero-size tensor to 4 elements: its storage
    // (no memory) cannot grow, on either route.
    auto* op = command.mutable_op();
    op->set_op_id(OpId("aten::resize_", ""));
    op->set_want_values(true);
    auto* ref = op->add_args()->mutable_tensor();
    ref->add_sizes(0);
    ref->add_strides(1);
    ref->set_dtype(static_cast<int32_t>(c10::ScalarType::Float));
    op->add_args()->mutable_ints()->add_values(4);
  } else if (kind == "altered_schema") {
    // As a client on another torch whose aten::add.Tensor defaulted alpha
    // to 2 would register it.
    auto* reg = command.mutable_register_op();
    reg->set_op_id(0x7ffffff1);
    reg->set_name("aten::add");
    reg->set_overload("Tensor");
    reg->set_schema("aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=2) -> Tensor");
  } else if (kind == "pinned_region_unknown") {
    auto* copy = command.mutable_copy_to_device();
    copy->set_addr(0x1000);
    copy->mutable_pinned()->set_region(0x7ffffff0);
    copy->mutable_pinned()->set_nbytes(64);
  } else if (kind == "pinned_range_outside_region") {
    // The last 8 bytes of a fresh pinned block, and 56 bytes past its end.
    at::DataPtr block = PinnedAllocator().allocate(4096);
    std::optional<PinnedLocation> where = FindPinned(block.get());
    TORCH_CHECK(where && where->region != 0, "pinned memory is not shared with flagosd here");
    const uint64_t nbytes = where->block_bytes;
    auto* copy = command.mutable_copy_to_device();
    copy->set_addr(0x1000);
    copy->mutable_pinned()->set_region(where->region);
    copy->mutable_pinned()->set_offset(nbytes - 8);
    copy->mutable_pinned()->set_nbytes(64);
    Call(std::move(command), "test command (" + kind + ")");
    return;
  } else if (kind == "graph_address_outside_segments" || kind == "graph_host_copy" ||
             kind == "graph_id_zero" || kind == "graph_other_device") {
    // A graph defined by hand: an op naming memory the session was not
    // given, a copy to the host (no graph holds one), id 0, a command of
    // another device.
    auto* part = command.mutable_define_graph();
    part->set_graph(kind == "graph_id_zero" ? 0 : 0x7ffffff2);
    part->set_last(true);
    flagos::v1::Command* captured = part->add_commands();
    captured->set_device(kind == "graph_other_device" ? 1 : 0);
    if (kind == "graph_host_copy") {
      captured->mutable_copy_from_device()->set_addr(0x1000);
      captured->mutable_copy_from_device()->set_nbytes(64);
    } else {
      auto* op = captured->mutable_op();
      op->set_op_id(OpId("aten::abs_", ""));
      auto* ref = op->add_args()->mutable_tensor();
      ref->set_addr(0x1000);
      ref->add_sizes(4);
      ref->add_strides(1);
      ref->set_dtype(static_cast<int32_t>(c10::ScalarType::Float));
    }
  } else if (kind == "replay_unknown_graph") {
    // Asynchronous: its error comes at the next synchronisation.
    command.mutable_replay_graph()->set_graph(0x7ffffff3);
    Enqueue(std::move(command), "test command (" + kind + ")");
    Synchronize(0);
    return;
  } else {
    TORCH_CHECK(false, "unknown bad-command kind '", kind,
                "' (address_outside_segments, unknown_op_id, malformed_tensor_ref, "
                "altered_schema, pinned_region_unknown, pinned_range_outside_region, "
                "graph_address_outside_segments, graph_host_copy, graph_id_zero, "
                "graph_other_device, replay_unknown_graph)");
  }
  Call(std::move(command), "test command (" + kind + ")");
}

// An argument from Python as the dispatcher would box it (a list is an int
// list only when every element is an int).
c10::IValue TestArgument(const py::handle& o) {
  if (o.is_none()) return c10::IValue();
  if (THPVariable_Check(o.ptr())) return c10::IValue(THPVariable_Unpack(o.ptr()));
  if (py::isinstance<py::bool_>(o)) return c10::IValue(o.cast<bool>());
  if (py::isinstance<py::int_>(o)) return c10::IValue(o.cast<int64_t>());
  if (py::isinstance<py::float_>(o)) return c10::IValue(o.cast<double>());
  if (PyComplex_Check(o.ptr())) {
    return c10::IValue(c10::complex<double>(PyComplex_RealAsDouble(o.ptr()),
                                            PyComplex_ImagAsDouble(o.ptr())));
  }
  if (py::isinstance<py::str>(o)) return c10::IValue(o.cast<std::string>());
  if (py::isinstance<py::list>(o)) {
    std::vector<int64_t> ints;
    for (const py::handle& e : o) ints.push_back(e.cast<int64_t>());
    return c10::IValue(ints);
  }
  TORCH_CHECK(false, "_test_op_call_wire: an argument of an unexpected Python type");
}

// The operator call for `args` and `outputs` encoded both ways: straight as
// wire bytes (OpCallWire, when it takes every argument) and as the protobuf
// Command EncodeValue builds. Returns {"wire": whether OpCallWire took it,
// "equal": whether the wire bytes parse into that Command (seq aside),
// "identical": whether they are protobuf's own bytes for it, "wire_bytes",
// "proto_bytes": their sizes, "wire_text", "proto_text"}.
py::dict TestOpCallWire(const py::list& py_args, const py::list& py_outputs, int device,
                        uint64_t stream, uint32_t op_id) {
  std::vector<c10::IValue> args;
  for (const py::handle& a : py_args) args.push_back(TestArgument(a));
  std::vector<at::Tensor> outputs;
  for (const py::handle& o : py_outputs) {
    outputs.push_back(o.is_none() ? at::Tensor() : THPVariable_Unpack(o.ptr()));
  }
  flagos::v1::Command expected;
  expected.set_device(device);
  expected.set_stream(stream);
  expected.mutable_op()->set_op_id(op_id);
  for (const c10::IValue& a : args) EncodeValue(a, expected.mutable_op()->add_args());
  for (const at::Tensor& t : outputs) EncodeTensorRef(t, expected.mutable_op()->add_outputs());

  OpCallWire wire;
  bool taken = true;
  for (const c10::IValue& a : args) taken = taken && AddWireArg(a, &wire);
  py::dict result;
  result["wire"] = taken;
  result["proto_bytes"] = expected.ByteSizeLong();
  result["proto_text"] = expected.DebugString();
  if (!taken) return result;
  for (const at::Tensor& t : outputs) wire.AddOutput(TensorRefFieldsOf(t));
  const absl::string_view bytes = wire.Serialize(device, stream, op_id);
  flagos::v1::Command parsed;
  const bool parses = parsed.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  result["equal"] =
      parses && google::protobuf::util::MessageDifferencer::Equals(parsed, expected);
  result["wire_bytes"] = bytes.size();
  result["identical"] = bytes == absl::string_view(expected.SerializeAsString());
  result["wire_text"] = parsed.DebugString();
  return result;
}

py::bytes TestReadDevice(uint64_t addr, uint64_t nbytes, int device) {
  std::string out;
  {
    py::gil_scoped_release release;
    out.resize(nbytes);
    flagos::v1::Command command;
    command.set_device(device);
    command.mutable_copy_from_device()->set_addr(addr);
    command.mutable_copy_from_device()->set_nbytes(nbytes);
    flagos::v1::Completion completion = Call(std::move(command), "test read");
    out = completion.data();
  }
  return py::bytes(out);
}

}  // namespace
}  // namespace torch_fl

PYBIND11_MODULE(_C, m) {
  using namespace torch_fl;
  m.doc() = "flagos runtime binding (internal; use torch_fl and torch.flagos)";
  // As in flagosd (daemon/main.cc): no global lock-graph bookkeeping on
  // every lock of the enqueue path.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  RegisterHooks();
  ForwardCompositeOps();

  m.def("_set_endpoint_resolver", [](py::function resolver) {
    // Keep the Python callable alive for the life of the process.
    auto* held = new py::function(std::move(resolver));
    SetEndpointResolver([held]() {
      py::gil_scoped_acquire gil;
      return (*held)().cast<std::string>();
    });
  });
  m.def("_close_session", &CloseSession, py::call_guard<py::gil_scoped_release>());
  m.def("_session_open", &SessionOpen);
  m.def("_endpoint", []() { return Session().endpoint(); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_session_id", []() { return Session().session_id(); },
        py::call_guard<py::gil_scoped_release>());
  // Which session of this process the next command goes to (1, 2, ... as
  // sessions are lost and reopened; ids restart with a restarted daemon).
  m.def("_session_generation", &CurrentGeneration);
  m.def("_device_count", &DeviceCount, py::call_guard<py::gil_scoped_release>());
  m.def("_device_count_no_throw", &DeviceCountNoThrow, py::call_guard<py::gil_scoped_release>());
  m.def("_current_device", &CurrentDevice);
  m.def("_set_device", &SetCurrentDevice, py::call_guard<py::gil_scoped_release>());
  m.def("_synchronize", &Synchronize, py::call_guard<py::gil_scoped_release>(),
        py::arg("device") = -1);
  // Streams (see runtime.h): ids, the calling thread's current stream.
  m.attr("_device_type") = static_cast<int>(c10::DeviceType::PrivateUse1);
  m.def("_stream_pool_size", []() { return kStreamPoolSize; });
  m.def("_current_stream", &CurrentStream, py::arg("device"));
  m.def("_exchange_stream", &ExchangeStream, py::call_guard<py::gil_scoped_release>(),
        py::arg("device"), py::arg("stream"));
  // torch.flagos.Event.elapsed_time (torch.Event's accepts no subclass).
  m.def("_event_elapsed_time", [](uint64_t start, uint64_t end) {
    flagos::v1::Command command;
    command.set_device(CurrentDevice());
    command.mutable_elapsed_time()->set_start(start);
    command.mutable_elapsed_time()->set_end(end);
    return Call(std::move(command), "event elapsed time").elapsed_ms();
  }, py::call_guard<py::gil_scoped_release>(), py::arg("start"), py::arg("end"));
  // torch_fl._sharing: flagos storages passed between processes.
  m.def("_share_storage", [](py::handle storage) {
    TORCH_CHECK(THPStorage_Check(storage.ptr()), "flagos: _share_storage takes an UntypedStorage");
    SharedStorageHandle handle;
    {
      py::gil_scoped_release release;
      handle = ShareStorage(THPStorage_Unpack(storage.ptr()));
    }
    return py::make_tuple(py::bytes(handle.grant), handle.device, handle.offset, handle.nbytes);
  });
  m.def("_open_shared_storage", [](py::bytes grant, int device, uint64_t offset, uint64_t nbytes) {
    SharedStorageHandle handle{std::string(grant), device, offset, nbytes};
    c10::Storage storage;
    {
      py::gil_scoped_release release;
      storage = OpenSharedStorage(handle);
    }
    return py::reinterpret_steal<py::object>(THPStorage_Wrap(std::move(storage)));
  });
  m.def("_collect_shared_blocks", &CollectSharedBlocks, py::call_guard<py::gil_scoped_release>());
  m.def("_empty_cache", []() { DeviceAllocator().emptyCache(); },
        py::call_guard<py::gil_scoped_release>());
  m.def("_daemon_info", []() {
    flagos::v1::NegotiateResponse info;
    {
      py::gil_scoped_release release;
      info = Session().info();
    }
    py::dict out;
    out["version"] = info.version();
    out["daemon_version"] = info.daemon_version();
    out["backend"] = info.backend();
    out["torch_version"] = info.torch_version();
    py::list devices;
    for (const auto& d : info.devices()) devices.append(DeviceDict(d));
    out["devices"] = devices;
    return out;
  });
  m.def("_daemon_stats", [](const std::string& endpoint) {
    flagos::v1::GetStatsResponse stats;
    {
      py::gil_scoped_release release;
      stats = DaemonStats(endpoint);
    }
    return StatsDict(stats);
  }, py::arg("endpoint") = "");
  m.def("_manual_seed_all", [](uint64_t seed) { ManualSeedAll(seed); });
  m.def("_default_generator", [](int device) {
    return py::reinterpret_steal<py::object>(THPGenerator_initDefaultGenerator(DefaultGenerator(device)));
  });
  // Graphs (graph.cpp): registered under the device's name once renamed.
  m.def("_register_graph_impl", &RegisterGraphImpl);
  m.def("_graph_pool_handle", []() {
    const c10::MempoolId_t id = NewGraphPoolHandle();
    return py::make_tuple(id.first, id.second);
  });
  m.def("_is_current_stream_capturing", &CurrentStreamCapturing, py::arg("device"));
  m.def("_forwarded_op_count", &ForwardCompositeOps);
  m.def("_meta_inference_count", &MetaInferenceCount);
  m.def("_test_bad_command", &TestBadCommand, py::call_guard<py::gil_scoped_release>());
  m.def("_test_read_device", &TestReadDevice);
  m.def("_test_op_call_wire", &TestOpCallWire, py::arg("args"), py::arg("outputs"),
        py::arg("device"), py::arg("stream"), py::arg("op_id"));
}
