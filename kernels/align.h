// Pointer alignment for the kernels' 8- and 16-byte vector paths (host side: which launch a layout can take).
#pragma once
#include <cstdint>

namespace ds::kern {

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }
inline bool aligned8(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 7u) == 0; }

}  // namespace ds::kern
