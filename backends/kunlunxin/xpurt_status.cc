#include "xpurt_status.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace flagos::kunlunxin {
namespace {

struct CodeInfo {
  int code;
  const char* name;     // the vendor header's enumerator
  const char* meaning;  // what it means, in our words
};

// The vendor's table (xpu/runtime.h's XPUError_t, as public sources show it).
constexpr CodeInfo kCodes[] = {
    {0, "XPU_SUCCESS", "success"},
    {701, "XPUERR_INVALID_DEVICE", "invalid device"},
    {702, "XPUERR_UNINIT", "the runtime is not initialised"},
    {703, "XPUERR_NODEV", "no device"},
    {704, "XPUERR_VERSION", "runtime and driver versions do not match"},
    {705, "XPUERR_NOMEM", "no device memory"},
    {706, "XPUERR_NOCPUMEM", "no host memory"},
    {707, "XPUERR_INVALID_PARAM", "invalid parameter"},
    {708, "XPUERR_NOXPUFUNC", "no such XPU function"},
    {709, "XPUERR_LDSO", "the runtime could not load a shared library (dlopen)"},
    {710, "XPUERR_LDSYM", "the runtime could not resolve a function (dlsym)"},
    {711, "XPUERR_SIMULATOR", "simulator error"},
    {712, "XPUERR_NOSUPPORT", "not supported"},
    {713, "XPUERR_ABNORMAL", "the device is abnormal after an earlier error"},
    {714, "XPUERR_KEXCEPTION", "exception in a kernel"},
    {715, "XPUERR_TIMEOUT", "timed out"},
    {716, "XPUERR_BUSY", "busy"},
    {717, "XPUERR_USEAFCLOSE", "use after close"},
    {718, "XPUERR_UCECC", "uncorrectable ECC error"},
    {719, "XPUERR_OVERHEAT", "overheat"},
    {800, "XPUERR_UNEXPECT", "unexpected error in the runtime"},
    {801, "XPUERR_DEVRESET", "the device is being reset"},
    {802, "XPUERR_HWEXCEPTION", "hardware exception"},
    {803, "XPUERR_HBM_INIT", "HBM initialisation failed"},
    {804, "XPUERR_DEVINIT", "device initialisation failed"},
    {805, "XPUERR_PEERRESET", "a peer device is being reset"},
    {806, "XPUERR_MAXDEV", "too many devices"},
    {807, "XPUERR_NOIOC", "unknown ioctl"},
    {808, "XPUERR_DMATIMEOUT", "DMA timed out"},
    {809, "XPUERR_DMAABORT", "DMA aborted"},
    {810, "XPUERR_MCUUNINIT", "the device firmware (MCU) is not initialised"},
    {811, "XPUERR_OLDFW", "the device firmware is too old"},
    {812, "XPUERR_PCIE", "PCIe error"},
    {813, "XPUERR_FAULT", "fault copying between kernel and user space"},
    {814, "XPUERR_INTERRUPTED", "interrupted"},
    {815, "XPUERR_AESTIMEOUT", "AES engine timed out"},
    {816, "XPUERR_HOSTMEM_ALREADY_REGISTERED", "host memory is already registered"},
    {817, "XPUERR_TRACER", "tracer error"},
};

const CodeInfo* Find(int normalized) {
  for (const CodeInfo& info : kCodes) {
    if (info.code == normalized) return &info;
  }
  return nullptr;
}

// What the user can do about a failed call, and the status code it maps to.
struct Advice {
  absl::StatusCode code;
  const char* hint;
};

Advice AdviceFor(int normalized) {
  switch (normalized) {
    case 705:
      return {absl::StatusCode::kResourceExhausted,
              "the device is out of memory: free tensors, call torch.flagos.empty_cache(), or run "
              "fewer processes on the device"};
    case 706:
      return {absl::StatusCode::kResourceExhausted,
              "the host is out of memory for the runtime: free host tensors, or run fewer "
              "processes on the node"};
    case 701:
    case 707:
      return {absl::StatusCode::kInvalidArgument,
              "libxpurt refused the call's arguments: this is a flagosd bug, please report it "
              "with this message"};
    case 712:
      return {absl::StatusCode::kUnimplemented,
              "this libxpurt or device does not support the call: check the XPU SDK version "
              "(XPU_ROOT)"};
    case 715:
    case 716:
      return {absl::StatusCode::kUnavailable,
              "the device did not answer in time: retry; if it persists, check the device with "
              "xpu_smi"};
    case 702:
    case 703:
    case 704:
    case 709:
    case 710:
      return {absl::StatusCode::kFailedPrecondition,
              "the XPU runtime cannot use the device: check that the driver is loaded (/dev/xpu* "
              "present) and that the XPU SDK under XPU_ROOT matches the driver version"};
    case 816:
      return {absl::StatusCode::kAlreadyExists, "the host memory is already registered"};
    case 713:
      return {absl::StatusCode::kInternal,
              "the device is in an error state from earlier work (a kernel fault or a hardware "
              "error): restart flagosd; if it persists, check the device with xpu_smi and the "
              "kernel log (dmesg)"};
    default:
      return {absl::StatusCode::kInternal,
              "a device or driver fault: check the device with xpu_smi and the kernel log "
              "(dmesg); the device may need a reset"};
  }
}

}  // namespace

std::string XpuCodeText(int code) {
  const int normalized = NormalizeXpuCode(code);
  if (const CodeInfo* info = Find(normalized)) {
    return absl::StrCat(info->name, " (", normalized, "): ", info->meaning);
  }
  if (normalized > 0 && normalized < 700) {
    // Below the vendor's base the runtime passes an errno through.
    return absl::StrCat("errno ", normalized, " (", std::strerror(normalized), ")");
  }
  return absl::StrCat("unknown code ", normalized);
}

absl::Status XpuStatus(int code, int device, absl::string_view call) {
  const int normalized = NormalizeXpuCode(code);
  if (normalized == kXpuSuccess) return absl::OkStatus();
  const Advice advice = AdviceFor(normalized);
  const std::string who =
      device >= 0 ? absl::StrCat("kunlunxin device ", device) : std::string("kunlunxin backend");
  return absl::Status(advice.code, absl::StrCat(who, ": ", call, " failed: ",
                                                XpuCodeText(normalized), "; ", advice.hint));
}

}  // namespace flagos::kunlunxin
