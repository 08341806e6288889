// tests/cuda_double/vmm_ipc_double_test.cc — IPC of the vmm backend's virtual memory on the CUDA
// double: ExportPhysical and ImportPhysical (bucketalloc/backend.h) as PyTorch's expandable
// segments share theirs (ExpandableSegment::share / fromShared).
//
// Covers: a handle exported once (one descriptor, closed with the handle), imported through a
// duplicate of the descriptor as the importing process gets it (pidfd_getfd), mapped in a second
// range and aliasing the first (a fake kernel writes through one mapping, another reads through
// the other), the counters (imports apart from creates); a device without shareable handles
// (cuMemCreate retried once without the handle type, then remembered; Export is FailedPrecondition);
// out of memory is not retried; a descriptor never exported is refused. The double supports
// imports in the exporting process only, which is what runs here.
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "bucketalloc/backend.h"
#include "cuda_double.h"

namespace bucketalloc {
namespace {

// A duplicate of this process's descriptor `fd` got the way an importing process gets an exported
// one: pidfd_open(exporter) then pidfd_getfd. Where the pidfd system calls are refused (ENOSYS: a
// kernel before 5.6; EPERM: a seccomp filter or ptrace policy) it falls back to dup(2), which names
// the same open file, and says so in `*how` (the caller prints it). -1 (errno set) on failure.
int DuplicateAsImporter(int fd, std::string* how) {
  const long pidfd = syscall(SYS_pidfd_open, getpid(), 0);
  if (pidfd >= 0) {
    const long dup_fd = syscall(SYS_pidfd_getfd, static_cast<int>(pidfd), fd, 0);
    const int getfd_errno = errno;
    close(static_cast<int>(pidfd));
    if (dup_fd >= 0) {
      *how = "pidfd_open + pidfd_getfd";
      return static_cast<int>(dup_fd);
    }
    errno = getfd_errno;
  }
  if (errno != ENOSYS && errno != EPERM) return -1;
  *how = std::string("dup(2): NOTE the pidfd system calls were refused here (") + std::strerror(errno) +
         "), so the importer's path (pidfd_getfd) was not exercised; dup names the same open file";
  return dup(fd);
}

// Every test: no rule broken, no corrupted data; the devices have shareable handles again after.
class VmmIpcDoubleTest : public ::testing::Test {
 protected:
  void SetUp() override {
    cudadouble_clear_violations();
    cudadouble_set_posix_fd_handles(1);
    corruptions_before_ = cudadouble_corruptions();
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    MakeBackend();
  }
  void TearDown() override {
    backend_.reset();
    cudadouble_set_posix_fd_handles(1);
    EXPECT_EQ(cudadouble_violation_count(), 0) << "CUDA rules broken:\n" << cudadouble_violations();
    EXPECT_EQ(cudadouble_corruptions(), corruptions_before_) << cudadouble_first_corruption();
    EXPECT_EQ(cudadouble_used_bytes(0), 0u) << "device memory not given back";
  }
  void MakeBackend() {
    absl::StatusOr<std::unique_ptr<Backend>> made = MakeVmmBackend(0);
    ASSERT_TRUE(made.ok()) << made.status();
    backend_ = std::move(*made);
    granule_ = backend_->Granularity();
  }

  std::unique_ptr<Backend> backend_;
  std::size_t granule_ = 0;
  std::uint64_t corruptions_before_ = 0;
};

TEST_F(VmmIpcDoubleTest, AnImportedHandleMapsTheExportersMemory) {
  Backend& b = *backend_;
  const std::size_t bytes = 2 * granule_;
  absl::StatusOr<PhysicalHandle> created = b.CreatePhysical(bytes);
  ASSERT_TRUE(created.ok()) << created.status();

  const std::uint64_t exports_before = cudadouble_calls("cuMemExportToShareableHandle");
  absl::StatusOr<int> fd = b.ExportPhysical(*created);
  ASSERT_TRUE(fd.ok()) << fd.status();
  absl::StatusOr<int> again = b.ExportPhysical(*created);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(*again, *fd) << "one descriptor per handle, kept";
  EXPECT_EQ(cudadouble_calls("cuMemExportToShareableHandle"), exports_before + 1);

  std::string how;
  const int dup_fd = DuplicateAsImporter(*fd, &how);
  ASSERT_GE(dup_fd, 0) << std::strerror(errno);
  std::cout << "the exported descriptor was duplicated with " << how << "\n";
  RecordProperty("descriptor_duplicated_with", how);
  absl::StatusOr<PhysicalHandle> imported = b.ImportPhysical(dup_fd);
  EXPECT_EQ(close(dup_fd), 0) << "ImportPhysical leaves the caller's descriptor to the caller";
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_NE(*imported, *created) << "an import is a handle of its own";
  EXPECT_EQ(cudadouble_used_bytes(0), bytes) << "an import is the same memory, not more";

  // Two ranges, one per handle: a kernel writes through the first, another reads through the second.
  absl::StatusOr<std::uintptr_t> first = b.ReserveAddressRange(bytes, 0);
  absl::StatusOr<std::uintptr_t> second = b.ReserveAddressRange(bytes, 0);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_TRUE(second.ok()) << second.status();
  std::size_t mapped = 0;
  const PhysicalPiece creator_piece[] = {{*created, bytes}};
  const PhysicalPiece imported_piece[] = {{*imported, bytes}};
  ASSERT_TRUE(b.MapRun(*first, creator_piece, &mapped).ok());
  ASSERT_EQ(mapped, 1u);
  ASSERT_TRUE(b.MapRun(*second, imported_piece, &mapped).ok());
  ASSERT_EQ(mapped, 1u);
  ASSERT_EQ(cudadouble_fill(nullptr, reinterpret_cast<void*>(*first), bytes, 0x5c), 0);
  ASSERT_EQ(cudadouble_expect(nullptr, reinterpret_cast<const void*>(*second), bytes, 0x5c), 0);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(cudadouble_corruptions(), corruptions_before_)
      << "the second mapping did not see the first's bytes: " << cudadouble_first_corruption();
  EXPECT_EQ(cudadouble_violation_count(), 0) << cudadouble_violations();

  BackendCounters c = b.counters();
  EXPECT_EQ(c.physical_creates, 1);
  EXPECT_EQ(c.physical_imports, 1);
  EXPECT_EQ(c.maps, 2);

  ASSERT_TRUE(b.Unmap(*first, bytes).ok());
  ASSERT_TRUE(b.Unmap(*second, bytes).ok());
  ASSERT_TRUE(b.ReleasePhysical(*imported).ok());
  c = b.counters();
  EXPECT_EQ(c.imported_releases, 1);
  EXPECT_EQ(c.physical_releases, 0) << "an import's release is not a create's";
  EXPECT_EQ(cudadouble_used_bytes(0), bytes) << "the creator's handle still holds the memory";
  EXPECT_GE(fcntl(*fd, F_GETFD), 0) << "the descriptor lives as long as its handle";
  ASSERT_TRUE(b.ReleasePhysical(*created).ok());
  EXPECT_EQ(fcntl(*fd, F_GETFD), -1) << "the descriptor was not closed with its handle";
  EXPECT_EQ(errno, EBADF);
  c = b.counters();
  EXPECT_EQ(c.physical_creates, 1);
  EXPECT_EQ(c.physical_releases, 1);
  EXPECT_EQ(c.physical_imports, 1);
  EXPECT_EQ(c.imported_releases, 1);
  ASSERT_TRUE(b.ReleaseAddressRange(*first, bytes).ok());
  ASSERT_TRUE(b.ReleaseAddressRange(*second, bytes).ok());
}

TEST_F(VmmIpcDoubleTest, ADeviceWithoutShareableHandlesCreatesPlainOnesThatDoNotExport) {
  cudadouble_set_posix_fd_handles(0);
  Backend& b = *backend_;
  const std::uint64_t creates_before = cudadouble_calls("cuMemCreate");
  absl::StatusOr<PhysicalHandle> first = b.CreatePhysical(granule_);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(cudadouble_calls("cuMemCreate"), creates_before + 2) << "refused with the handle type, then without";
  absl::StatusOr<PhysicalHandle> second = b.CreatePhysical(granule_);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(cudadouble_calls("cuMemCreate"), creates_before + 3) << "the refusal is remembered";

  const std::uint64_t exports_before = cudadouble_calls("cuMemExportToShareableHandle");
  for (PhysicalHandle h : {*first, *second}) {
    absl::StatusOr<int> fd = b.ExportPhysical(h);
    EXPECT_TRUE(absl::IsFailedPrecondition(fd.status())) << fd.status();
    std::cout << "export without shareable handles: " << fd.status() << "\n";
    EXPECT_TRUE(absl::StrContains(fd.status().message(), "CUDA_ERROR_NOT_SUPPORTED")) << fd.status();
    EXPECT_TRUE(absl::StrContains(fd.status().message(), "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR")) << fd.status();
  }
  EXPECT_EQ(cudadouble_calls("cuMemExportToShareableHandle"), exports_before) << "refused before the driver";
  const BackendCounters c = b.counters();
  EXPECT_EQ(c.physical_creates, 2);
  EXPECT_EQ(c.failed_physical_creates, 0);
  ASSERT_TRUE(b.ReleasePhysical(*first).ok());
  ASSERT_TRUE(b.ReleasePhysical(*second).ok());
  EXPECT_EQ(b.counters().physical_releases, 2);
}

TEST_F(VmmIpcDoubleTest, OutOfMemoryIsNotRetriedWithoutTheHandleType) {
  Backend& b = *backend_;
  absl::StatusOr<DeviceMemInfo> info = b.GetMemInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  const std::uint64_t creates_before = cudadouble_calls("cuMemCreate");
  absl::StatusOr<PhysicalHandle> huge = b.CreatePhysical((info->total_bytes / granule_ + 1) * granule_);
  EXPECT_TRUE(absl::IsResourceExhausted(huge.status())) << huge.status();
  EXPECT_EQ(cudadouble_calls("cuMemCreate"), creates_before + 1);
  EXPECT_EQ(b.counters().failed_physical_creates, 1);
  // Still shareable: the next handle exports.
  absl::StatusOr<PhysicalHandle> h = b.CreatePhysical(granule_);
  ASSERT_TRUE(h.ok()) << h.status();
  absl::StatusOr<int> fd = b.ExportPhysical(*h);
  EXPECT_TRUE(fd.ok()) << fd.status();
  ASSERT_TRUE(b.ReleasePhysical(*h).ok());
}

TEST_F(VmmIpcDoubleTest, ADescriptorNeverExportedIsRefused) {
  Backend& b = *backend_;
  absl::StatusOr<PhysicalHandle> negative = b.ImportPhysical(-1);
  EXPECT_TRUE(absl::IsInvalidArgument(negative.status())) << negative.status();
  const int other = memfd_create("not_exported", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  absl::StatusOr<PhysicalHandle> imported = b.ImportPhysical(other);
  close(other);
  ASSERT_FALSE(imported.ok());
  EXPECT_TRUE(absl::StrContains(imported.status().message(), "cuMemImportFromShareableHandle")) << imported.status();
  EXPECT_TRUE(absl::StrContains(imported.status().message(), "CUDA_ERROR_INVALID_VALUE")) << imported.status();
  const std::string seen = cudadouble_violations();
  EXPECT_EQ(cudadouble_violation_count(), 1) << seen;
  EXPECT_TRUE(absl::StartsWith(seen, "vmm-import-exported:")) << seen;
  cudadouble_clear_violations();
  EXPECT_EQ(b.counters().physical_imports, 0);
}

}  // namespace
}  // namespace bucketalloc
