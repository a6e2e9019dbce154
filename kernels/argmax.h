// The greedy choice and one token's log-probability on the device: the index of the first largest entry of a float vector (the logits of a decoding
// step), so that a step need not bring the whole vocabulary's logits to the host.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace ds::kern {

// out[0] = the first index of the largest x[i] (NaN never counts as larger; -1 when no entry is larger than -inf),
// out[1] = that value's bits (a float). One block; n up to 2^31 - 1.
cudaError_t launch_argmax_f32(const float* x, int64_t n, int32_t* out, cudaStream_t stream);

// *out = x[id] - log(sum_i exp(x[i])) in double (the log-probability of token id under the logits x; the exponentials
// in float against the row's maximum, their sums in double; NaN when a logit is NaN or +inf). One block: queued after
// a forward, it lets a caller read many forwards' log-probabilities with one wait (head importance).
cudaError_t launch_token_logprob_f32(const float* x, int64_t n, int32_t id, double* out, cudaStream_t stream);

}  // namespace ds::kern
