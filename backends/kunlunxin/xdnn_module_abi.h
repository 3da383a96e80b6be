/* The C interface between flagosd and its xdnn binding module,
 * libflagos_kunlunxin_xdnn.so (backends/kunlunxin/xdnn/).
 *
 * The vendor op library xdnn_pytorch has a C++ API (mangled names, its own
 * Tensor and Scalar types), so only code compiled against its header can
 * call it. That code lives in the module, built when the header is found
 * (XDNN_ROOT, FLAGOS_VENDOR_TORCH_LIB, or torch_xmlir in site-packages) and
 * loaded by flagosd at start. The module includes neither torch nor any
 * flagos header but this one: an operator call crosses this boundary as
 * plain descriptors, so the module does not depend on the torch flagosd was
 * built against (the vendor torch that ships xdnn_pytorch has its own).
 *
 * Completion: `call` issues the work on `stream` and returns; the device
 * runs it later. A refusal (code DECLINED) issued nothing, so the daemon may
 * run the same call on its cpu_fallback route.
 *
 * Thread safety: `call` may be called from any thread; calls that name the
 * same stream are serialised by the caller (runtime.h). */
#ifndef FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_ABI_H_
#define FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_ABI_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Bumped whenever a struct below changes; flagosd refuses a module of
 * another version, naming both. */
#define FLAGOS_XDNN_MODULE_ABI 1
/* The module's one exported function: const flagos_xdnn_module* (void). */
#define FLAGOS_XDNN_MODULE_ENTRY "flagos_xdnn_module_v1"

/* Element types, numbered as c10::ScalarType numbers them (flagosd checks
 * this at compile time). */
enum flagos_xdnn_dtype {
  FLAGOS_XDNN_UINT8 = 0,
  FLAGOS_XDNN_INT8 = 1,
  FLAGOS_XDNN_INT16 = 2,
  FLAGOS_XDNN_INT32 = 3,
  FLAGOS_XDNN_INT64 = 4,
  FLAGOS_XDNN_FLOAT16 = 5,
  FLAGOS_XDNN_FLOAT32 = 6,
  FLAGOS_XDNN_FLOAT64 = 7,
  FLAGOS_XDNN_BOOL = 11,
  FLAGOS_XDNN_BFLOAT16 = 15,
  FLAGOS_XDNN_ABSENT = -1,
};

/* A tensor over device memory: `data` is the device address of its first
 * element (NULL when it has no elements), sizes and strides in elements.
 * An output the caller does not want (an undefined result, output_mask
 * false) has dtype FLAGOS_XDNN_ABSENT and no data. */
typedef struct {
  void* data;
  int32_t dtype;
  int32_t dim;
  const int64_t* sizes;
  const int64_t* strides;
} flagos_xdnn_tensor;

enum flagos_xdnn_arg_kind {
  FLAGOS_XDNN_ARG_NONE = 0,    /* None, or an undefined tensor */
  FLAGOS_XDNN_ARG_TENSOR = 1,  /* tensor */
  FLAGOS_XDNN_ARG_INT = 2,     /* i (int, ScalarType, an integral Scalar) */
  FLAGOS_XDNN_ARG_DOUBLE = 3,  /* d (float, a floating Scalar) */
  FLAGOS_XDNN_ARG_BOOL = 4,    /* i: 0 or 1 */
  FLAGOS_XDNN_ARG_INTS = 5,    /* ints[count] */
  FLAGOS_XDNN_ARG_DOUBLES = 6, /* doubles[count] */
  FLAGOS_XDNN_ARG_TENSORS = 7, /* tensors[count] */
  FLAGOS_XDNN_ARG_STRING = 8,  /* string (NUL-terminated) */
  FLAGOS_XDNN_ARG_BOOLS = 9,   /* ints[count], each 0 or 1 */
};

typedef struct {
  int32_t kind;
  int64_t i;
  double d;
  flagos_xdnn_tensor tensor;
  int64_t count;
  const int64_t* ints;
  const double* doubles;
  const flagos_xdnn_tensor* tensors;
  const char* string;
} flagos_xdnn_arg;

typedef struct {
  /* "aten::add.out": the overload being run. */
  const char* op;
  /* Its schema's arguments in order, out= arguments included. */
  int32_t nargs;
  const flagos_xdnn_arg* args;
  /* A functional overload's results: one tensor per tensor it returns
   * (lists flattened), already of the right sizes; none otherwise. */
  int32_t nouts;
  const flagos_xdnn_tensor* outs;
  int32_t device;
  /* libxpurt's XPUStream the work goes to (NULL: the NULL stream). The
   * caller made `device` current on this thread. */
  void* stream;
} flagos_xdnn_call;

enum flagos_xdnn_code {
  FLAGOS_XDNN_OK = 0,
  /* Not run, nothing issued: xdnn's NOT_IMPLEMENT, or a dtype or argument
   * shape the binding does not take. The daemon runs the call on
   * cpu_fallback. */
  FLAGOS_XDNN_DECLINED = 1,
  /* xdnn's INVALID_PARAM. */
  FLAGOS_XDNN_INVALID = 2,
  /* xdnn's RUNTIME_ERROR, or any other failure. */
  FLAGOS_XDNN_FAILED = 3,
  /* xdnn's NO_ENOUGH_WORKSPACE. */
  FLAGOS_XDNN_NO_WORKSPACE = 4,
};

typedef struct {
  int32_t code;        /* enum flagos_xdnn_code */
  char vendor_call[64]; /* the xdnn_pytorch function called, "" if none */
  char vendor_code[32]; /* its return code's name, "" if none */
  char message[256];   /* why, for DECLINED/INVALID/FAILED */
} flagos_xdnn_result;

typedef struct {
  uint32_t abi; /* FLAGOS_XDNN_MODULE_ABI */
  /* What it was built against: "xdnn_pytorch header <path>". */
  const char* built_against;
  /* The aten overloads it binds ("aten::add.out"), sorted. */
  int32_t nops;
  const char* const* ops;
  void (*call)(const flagos_xdnn_call* call, flagos_xdnn_result* result);
} flagos_xdnn_module;

typedef const flagos_xdnn_module* (*flagos_xdnn_module_entry)(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FLAGOS_BACKENDS_KUNLUNXIN_XDNN_MODULE_ABI_H_ */
