// attack: include spelled with the %: digraph
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (static policy: digraphs are undone before the scan)
// why: %: is an alternative token for #, so a scan for "#include" alone misses the directive.

#include <cuda_runtime.h>
#include <cuda_bf16.h>

%:include "@SECRET_PATH@"
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
