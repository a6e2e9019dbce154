// Stand-in for libopenblas.so.0 in the packs carried to the GPU machine (tools/gui_on_device.sh and
// tools/run_cuda_suite.sh): cblas_sgemm as plain loops, correct and slow. Only the CPU backend calls it, and on the
// GPU machine only tests on tiny fixtures do; the real library and its Fortran runtime are 5 MB of the carry limit.
#include <stdio.h>
enum { RowMajor = 101, ColMajor = 102, NoTrans = 111 };
void openblas_set_num_threads(int n) { (void)n; }
void cblas_sgemm(int order, int ta, int tb, int M, int N, int K, float alpha, const float* A, int lda,
                 const float* B, int ldb, float beta, float* C, int ldc) {
  static int warned;
  if (!warned++) fprintf(stderr, "diffscope pack: cblas_sgemm is a slow stand-in for OpenBLAS (use the CUDA backend)\n");
  if (order == ColMajor) {  // C^T = op(B)^T op(A)^T in row-major terms
    int t = ta; ta = tb; tb = t; t = M; M = N; N = t;
    const float* p = A; A = B; B = p; t = lda; lda = ldb; ldb = t;
  }
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = 0;
      for (int k = 0; k < K; ++k)
        s += (ta == NoTrans ? A[(long)i * lda + k] : A[(long)k * lda + i]) *
             (tb == NoTrans ? B[(long)k * ldb + j] : B[(long)j * ldb + k]);
      C[(long)i * ldc + j] = alpha * s + (beta == 0.f ? 0.f : beta * C[(long)i * ldc + j]);
    }
}
