// Programmatic dependent launch (PDL) from the device side, sm_90 and newer; on older code both are no-ops. The host
// asks for a programmatic launch (cudaLaunchAttributeProgrammaticStreamSerialization) only where the code that runs
// was built for sm_90 or newer.
#pragma once

namespace ds::kern {

// Wait for the grid before this one in the stream to complete and its writes to be visible.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Let the next grid in the stream, if it was launched as a programmatic dependent, start launching: its CTAs may
// then run up to their own pdl_wait while this grid finishes. A no-op for a successor launched normally.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

}  // namespace ds::kern
