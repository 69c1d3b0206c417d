// attack: include hidden from the scan by a u8R raw string that looks like an open comment
// expect: POLICY_VIOLATION | COMPILE_ERROR
// stage: cpu
// defended: yes (the policy's scan knows the u8R/uR/UR/LR raw-string prefixes)
// why: the policy recognises a raw string only when R is not preceded by a letter or digit, so
//   u8R"( " /* )" is read as a short ordinary string followed by the start of a block comment that
//   runs to the "// */" below; the compiler sees a raw string, then a real #include. The file is
//   read and the static_assert quotes its macro in the compile log. Fix: recognise the u8R, uR, UR
//   and LR prefixes (and R after any identifier character that is a prefix).

#include <cuda_runtime.h>
#include <cuda_bf16.h>

static const char* decoy = u8R"( " /* )";
#include "@SECRET_PATH@"
// */
static_assert(false, HOSTILE_SECRET);

extern "C" int gemm(const __nv_bfloat16* A, const __nv_bfloat16* B, __nv_bfloat16* C, int M, int N,
                    int K, cudaStream_t stream) {
  return 0;
}
