#include "byte_size.h"

#include <cctype>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace flagos::daemon {
namespace {

struct Unit {
  const char* name;
  int shift;
};
constexpr Unit kUnits[] = {{"", 0},     {"b", 0},     {"k", 10},  {"kib", 10}, {"m", 20},
                           {"mib", 20}, {"g", 30},    {"gib", 30}, {"t", 40},  {"tib", 40}};

absl::Status Invalid(absl::string_view text, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat(
      "'", text, "' is not a byte size (", why,
      "); write a number of bytes with an optional suffix K, KiB, M, MiB, G, GiB, T or TiB "
      "(powers of 1024), e.g. 8GiB or 512M"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(text);
  size_t number_end = 0;
  while (number_end < trimmed.size() &&
         (std::isdigit(static_cast<unsigned char>(trimmed[number_end])) ||
          trimmed[number_end] == '.')) {
    ++number_end;
  }
  const absl::string_view number = trimmed.substr(0, number_end);
  const std::string suffix = absl::AsciiStrToLower(trimmed.substr(number_end));
  if (number.empty()) return Invalid(text, "no number");
  int shift = -1;
  for (const Unit& unit : kUnits) {
    if (suffix == unit.name) shift = unit.shift;
  }
  if (shift < 0) {
    return Invalid(text, absl::StrCat("unknown suffix '", trimmed.substr(number_end), "'"));
  }
  if (number.find('.') == absl::string_view::npos) {
    uint64_t value = 0;
    if (!absl::SimpleAtoi(number, &value)) return Invalid(text, "the number does not fit 64 bits");
    if (shift > 0 && value > (UINT64_MAX >> shift)) return Invalid(text, "more than 2^64 bytes");
    return value << shift;
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value)) return Invalid(text, "malformed number");
  const long double bytes = std::ldexp(static_cast<long double>(value), shift);
  if (bytes >= 18446744073709551615.0L) return Invalid(text, "more than 2^64 bytes");
  if (bytes != std::floor(bytes)) return Invalid(text, "not a whole number of bytes");
  return static_cast<uint64_t>(bytes);
}

std::string FormatByteSize(uint64_t bytes) {
  static constexpr const char* kNames[] = {"TiB", "GiB", "MiB", "KiB"};
  static constexpr int kShifts[] = {40, 30, 20, 10};
  for (int i = 0; i < 4; ++i) {
    const uint64_t unit = uint64_t{1} << kShifts[i];
    if (bytes != 0 && bytes % unit == 0) return absl::StrCat(bytes / unit, kNames[i]);
  }
  return absl::StrCat(bytes);
}

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<uint64_t> bytes = ParseByteSize(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) { return FormatByteSize(size.bytes); }

}  // namespace flagos::daemon
