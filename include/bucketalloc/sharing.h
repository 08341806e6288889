// bucketalloc/sharing.h — the vocabulary of CUDA IPC (PyTorch's shareIpcHandle / getIpcDevPtr):
// what another process needs to map the memory of a live allocation (Allocator::ShareBlock,
// Allocator::OpenShared).
#ifndef BUCKETALLOC_SHARING_H_
#define BUCKETALLOC_SHARING_H_

#include <cstddef>
#include <cstdint>
#include <vector>

namespace bucketalloc {

// A physical piece of a virtual-memory segment: a POSIX file descriptor of the sharing process
// (the backend's, valid while the piece exists) and its bytes.
struct SharedPiece {
  int fd = -1;
  std::size_t bytes = 0;
};
struct SharedMemory {
  // false: a plain backend allocation (cudaMalloc): [base, base + bytes) is the segment holding the
  // allocation, which cudaIpcGetMemHandle(base) shares. true: the physical pieces mapped under the
  // allocation (the vmm backend's stitched segments), side by side from `base`; another process
  // maps them with Allocator::OpenShared.
  bool virtual_memory = false;
  std::uintptr_t base = 0;
  std::size_t bytes = 0;
  std::size_t offset = 0;  // the allocation's address - base
  std::vector<SharedPiece> pieces;
};

}  // namespace bucketalloc

#endif  // BUCKETALLOC_SHARING_H_
