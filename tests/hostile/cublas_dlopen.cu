// attack: cuBLAS through dlopen/dlsym
// expect: POLICY_VIOLATION
// stage: cpu
// defended: yes (static policy: dlopen, dlsym and the other loader calls refused)
// why: the dynamic loader reaches any library on the host at run time, whatever was linked; the
//   library's name is disguised here, so only the loader rule stands in the way.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

extern "C" void* dlopen(const char* file, int mode);
extern "C" void* dlsym(void* handle, const char* name);

// The library name is disguised ("cuXlas") so that only the loader rule can catch this.
static void undisguise(char* name) {
  for (; *name; ++name) if (*name == 'X') *name = 'b';
}

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  char soname[] = "libcuXlas.so", symbol[] = "cuXlasGemmEx";
  undisguise(soname);
  undisguise(symbol);
  void* library = dlopen(soname, 2);
  return library && dlsym(library, symbol) ? 0 : 1;
}
