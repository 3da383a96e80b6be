// Test introspection exported by the fake libbkcl (tests/fakes/bkcl).
// These symbols exist only in the fake: the real BKCL has none of them, so
// product code must never call them. Tests reach them with
// dlsym(handle or RTLD_DEFAULT, "fake_bkcl_...").
#ifndef FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_H_
#define FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_H_

#include <cstdint>

#define FAKE_BKCL_API __attribute__((visibility("default")))

extern "C" {

// Calls of bkcl_<name> so far in this process ("all_reduce"; the full
// "bkcl_all_reduce" works too), counting refused and injected failures;
// 0 for a name the library does not export.
FAKE_BKCL_API uint64_t fake_bkcl_calls(const char* name);
// Contexts bkcl_init_rank returned and bkcl_destroy_context has not freed.
FAKE_BKCL_API int fake_bkcl_live_contexts(void);
// The last error the fake recorded: a refused bkcl_init_rank, a round whose
// ranks disagreed, a wait that timed out or was cut short by an abort, an
// abort. "" when none. The text stays valid until this thread's next call.
FAKE_BKCL_API const char* fake_bkcl_last_error(void);

}  // extern "C"

#endif  // FLAGOS_TESTS_FAKES_BKCL_FAKE_BKCL_H_
