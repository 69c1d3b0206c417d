// attack: cuBLAS through dlopen/dlsym with pasted loader names and library names fixed up at run
//   time
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (dlopen/dlsym are not among the allowed undefined symbols of the object)
// why: CAT(dl, open) and CAT(dl, sym) hide the loader from the policy's pattern, the library and
//   symbol names are stored as "cuXlas..." and patched at run time, and glibc (2.34+) exports
//   dlopen/dlsym from libc itself, so -z defs links them. At run time dlopen by soname returns the
//   cuBLAS torch already loaded, and the GEMM is cuBLAS's. Fix: allow-list the library's undefined
//   dynamic symbols after the link (dlopen, dlsym and friends are not on it).

#include <cuda_runtime.h>
#include <cuda_bf16.h>

#include <cstring>

#define CAT(a, b) a##b
extern "C" void* CAT(dl, open)(const char* file, int mode);
extern "C" void* CAT(dl, sym)(void* handle, const char* name);
enum { kOpN = 0, kOpT = 1, kBf16 = 14, kCompute32F = 68, kAlgoDefault = -1 };
typedef int (*CreateFn)(void**);
typedef int (*SetStreamFn)(void*, cudaStream_t);
typedef int (*GemmFn)(void*, int, int, int, int, int, const void*, const void*, int, int,
                      const void*, int, int, const void*, void*, int, int, int, int);

static void* lookup(void* library, const char* disguised) {
  char name[64];
  strncpy(name, disguised, sizeof name - 1);
  name[sizeof name - 1] = 0;
  for (char* p = name; *p; ++p) if (*p == 'X') *p = 'b';
  return library ? CAT(dl, sym)(library, name) : nullptr;
}

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  static void* handle = nullptr;
  void* library = nullptr;
  const char* sonames[] = {"libcuXlas.so.13", "libcuXlas.so.12", "libcuXlas.so"};
  for (const char* disguised : sonames) {
    char soname[64];
    strncpy(soname, disguised, sizeof soname - 1);
    soname[sizeof soname - 1] = 0;
    for (char* p = soname; *p; ++p) if (*p == 'X') *p = 'b';
    if ((library = CAT(dl, open)(soname, 2))) break;
  }
  auto create = reinterpret_cast<CreateFn>(lookup(library, "cuXlasCreate_v2"));
  auto set_stream = reinterpret_cast<SetStreamFn>(lookup(library, "cuXlasSetStream_v2"));
  auto gemm_ex = reinterpret_cast<GemmFn>(lookup(library, "cuXlasGemmEx"));
  if (!create || !set_stream || !gemm_ex) return 1;
  if (!handle && create(&handle) != 0) return 2;
  set_stream(handle, stream);
  const float alpha = 1.0f, beta = 0.0f;
  return gemm_ex(handle, kOpT, kOpN, N, M, K, &alpha, B, kBf16, K, A, kBf16, K, &beta, C,
                 kBf16, N, kCompute32F, kAlgoDefault);
}
