// flagos_import_grant ENDPOINT GRANT_HEX DEVICE: opens a session on ENDPOINT
// as the calling user (with its staging region, so flagosd knows the uid)
// and asks to import the grant. Prints "IMPORTED <segment bytes>" or
// "REFUSED <code>: <message>" and exits 0; exits 2 when it cannot connect.
// test_sharing.py runs it as another user (a Python client cannot run as
// one: the interpreter may live in root's home).
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/time/time.h"
#include "flagos/client/connection.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s ENDPOINT GRANT_HEX DEVICE\n", argv[0]);
    return 2;
  }
  auto connection =
      flagos::client::Connection::Open(argv[1], absl::Seconds(10), "flagos_import_grant");
  if (!connection.ok()) {
    std::fprintf(stderr, "%s\n", std::string(connection.status().message()).c_str());
    return 2;
  }
  const std::string hex = argv[2];
  if (hex.size() % 2 != 0 || hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
    std::fprintf(stderr, "GRANT_HEX is not hexadecimal\n");
    return 2;
  }
  const std::string grant = absl::HexStringToBytes(hex);
  flagos::v1::Command command;
  command.set_device(std::atoi(argv[3]));
  command.mutable_import_memory()->set_grant(grant);
  auto completion = (*connection)->Call(std::move(command), "import a grant");
  if (completion.ok()) {
    std::printf("IMPORTED %llu\n", static_cast<unsigned long long>(completion->segment_nbytes()));
  } else {
    std::printf("REFUSED %s: %s\n", absl::StatusCodeToString(completion.status().code()).c_str(),
                std::string(completion.status().message()).c_str());
  }
  (*connection)->Close();
  return 0;
}
