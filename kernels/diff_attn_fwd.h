// Fused causal attention forward on mma.sync, sm_80 and newer: the portable fused kernel (diff_attn_fwd.cu), for
// differential heads and, in the lockstep and both-maps schedules, plain heads in pairs. Reached through
// attn_dispatch.h, which picks the schedule that fits the device.
#pragma once
#include "attn_maps.h"
#include "attn_params.h"

namespace ds::kern {

// The schedules of the P V products (diff_attn_fwd.cu's header says how each works).
enum MmaSchedule { MMA_LOCKSTEP = 1, MMA_VSPLIT = 2, MMA_BOTH = 4 };

// Shared memory per CTA and the CTAs per SM a schedule needs to run as designed; {0, 0} when it is not built for d.
struct MmaFootprint {
  int smem = 0, ctas_per_sm = 0;
};
MmaFootprint diff_attn_mma_footprint(int schedule, int d);

// d = 64 or 128 (MMA_BOTH: d = 64), H even; plain heads (!p.diff) take MMA_LOCKSTEP and MMA_BOTH only. Returns the
// launch error (cudaSuccess when queued).
cudaError_t launch_attn_mma(const AttnParams& p, int schedule, cudaStream_t stream);

// Per-row statistics of every view head of a layer's maps, as launch_attn_map_softmax writes them
// ([view heads][n][MAP_NSTAT], batch 0; attn_maps.h), from the S products on the tensor cores in two passes over
// the keys, without materialising a map. d = 64 or 128, H even, sm_80+ with attn_row_stats_smem(d) bytes of shared
// memory per block. Like the forward kernels, these see only the keys of p.window (key tiles left of it are not
// visited) and read K from p.kv when it is set.
int attn_row_stats_smem(int d);
cudaError_t launch_attn_row_stats(const AttnParams& p, float* row_stats, cudaStream_t stream);
// A pooled view of view head `head` (rectangle, grid and pooling in v; engine/core/map_query.h has the rules) by the
// same two passes, folded into the accumulators a1, a2, diff [v.rows x v.cols] (attn_maps.h: zeroed first, values
// after launch_attn_view_finish). Same conditions as launch_attn_row_stats; a2 may be null for plain heads.
cudaError_t launch_attn_map_view(const AttnParams& p, const ViewPoolArgs& v, int head, float* a1, float* a2, float* diff,
                                 cudaStream_t stream);

}  // namespace ds::kern
