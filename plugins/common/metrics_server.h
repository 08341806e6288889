// plugins/common/metrics_server.h — the /metrics endpoint of the C ABI library and the LD_PRELOAD
// shim (layer L5): BUCKETALLOC_METRICS_ADDR=HOST:PORT serves the allocator's Prometheus metrics
// (bucketalloc/metrics.h) over HTTP for a C host or a CUDA program that has no metrics server of
// its own (a Python server exposes them through prometheus_client instead: bucketalloc_torch).
//
// Owns: `MetricsServer`, one listening socket and the one thread that answers it: GET /metrics (or
// /) and HEAD get the text with Prometheus's content type; another path 404; another method 405
// (with `Allow: GET, HEAD`); a request line that is not HTTP 400; a request line longer than
// kMaxRequestBytes 414, a longer head 431. The thread serves up to kMaxConnections connections at
// once with poll(2) over non-blocking sockets, so a scrape is answered at once however many idle or
// slow clients hold connections: a client that sends nothing for 2 s, takes more than 5 s to send
// its request, or takes 2 s without reading any of the answer (10 s in all) is dropped, and when
// kMaxConnections are open a new one drops the oldest still waiting for its request. A process out
// of file descriptors (EMFILE, ENFILE) gets its pending connections closed unanswered through a
// spare descriptor, and the thread backs off (at most 10 tries a second; reported once on stderr).
// The thread renders from copies taken under each device's lock (figures the pools keep as blocks
// move: a copy of fixed size, no walk over the blocks); nothing runs on the allocation path itself.
//
// Addresses: a numeric host (127.0.0.1, 0.0.0.0, [::1], [::]) is bound by Start on the calling
// thread, which does no name lookup and no network wait. A host name ("localhost", "gpu-17") is
// resolved (getaddrinfo, which may wait seconds for a silent DNS server) and bound on the server's
// own thread: port() is -1 until then, status() says why, and `on_bound` reports the outcome.
// `StartMetricsServerFromEnv` starts the process's one server; a bad address or a failed bind is
// printed once on stderr (from the server's thread for a host name) and changes nothing else (the
// allocator serves as before); with port 0 the port bound is printed (one line), and
// `ProcessMetricsPort` (bucketalloc_metrics_port) returns it.
// Thread-safety: Start and the destructor from one thread; port() and status() from any; the
// server thread only resolves, renders and writes. fork(2): the child has no server thread and
// closes the process server's sockets (all close-on-exec too); its ProcessMetricsPort is an error.
//
// Example:
//   absl::StatusOr<std::unique_ptr<MetricsServer>> s =
//       MetricsServer::Start("127.0.0.1:0", [&] { return MetricsToPrometheus(a->Metrics()); });
//   int port = (*s)->port();   // curl http://127.0.0.1:<port>/metrics
#ifndef BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_
#define BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_

#include <array>
#include <atomic>
#include <cstddef>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "bucketalloc/allocator.h"

namespace bucketalloc::plugins {

class MetricsServer {
 public:
  // Connections served at once; the oldest waiting for its request is dropped for a new one.
  static constexpr std::size_t kMaxConnections = 256;
  // The longest request head (its line and headers) read.
  static constexpr std::size_t kMaxRequestBytes = 8192;

  // Runs on the server's thread once a host name is resolved and bound: OK and the port, or the
  // failure (Unavailable) and -1. Not called for a numeric host: Start returns its outcome.
  using OnBound = std::function<void(const absl::Status& status, int port)>;

  // Listens on `addr` ("HOST:PORT", "[IPv6]:PORT"; port 0 picks a free one) and answers with
  // `render()`. InvalidArgument naming what is accepted for a bad address; Unavailable when a
  // numeric host cannot be bound (the port is taken, the address is not this machine's). A host
  // name is resolved and bound on the server's thread (see the banner).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(absl::string_view addr,
                                                              std::function<std::string()> render,
                                                              OnBound on_bound = nullptr);
  // Stops the thread and closes the sockets (waits for a host name's lookup in progress).
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // The port listened on; -1 while a host name is being resolved, or when it failed.
  int port() const { return port_.load(std::memory_order_acquire); }
  // OK while listening; Unavailable naming the host while it is resolved, or why it failed.
  absl::Status status() const;
  const std::string& address() const { return addr_; }

  // In a child of fork (the thread does not exist there): closes the listening socket and every
  // connection, so that the port is free again when the parent ends and clients see the parent's
  // answers end. Only close(2), as a pthread_atfork child handler may.
  void CloseAfterFork();

 private:
  struct Connection;
  MetricsServer(std::string addr, int fd, std::string host, std::string service, std::function<std::string()> render,
                OnBound on_bound);
  void Run();
  bool BindOnThisThread();  // the host name's lookup and bind, on the server's thread
  void Serve();
  bool Read(Connection& c);   // false: the connection is done
  bool Write(Connection& c);  // false: the connection is done
  void Answer(Connection& c);
  void Close(Connection& c);

  const std::string addr_;
  const std::string host_, service_;  // for a host name resolved on the thread
  const std::function<std::string()> render_;
  const OnBound on_bound_;
  std::atomic<int> listen_fd_;
  std::atomic<int> port_{-1};
  std::atomic<int> wake_fd_{-1};                           // an eventfd the destructor writes to
  std::atomic<int> spare_fd_{-1};                          // /dev/null, given up to accept (and close) when out of fds
  std::array<std::atomic<int>, kMaxConnections> clients_;  // the connections' sockets, -1 free
  mutable std::mutex mu_;
  std::string failure_;  // guarded by mu_: why a host name could not be served
  std::atomic<bool> stopping_{false};
  bool reported_no_fds_ = false;  // the server thread's
  std::thread thread_;
};

// When BUCKETALLOC_METRICS_ADDR is set, starts (once per process) the server of `allocator`'s
// metrics, which lives as long as the process; `who` names the library in the lines printed on
// stderr: when it cannot start ("bucketalloc", "bucketalloc preload"; a bad address, a taken port,
// a host that does not resolve, no thread; nothing else changes then), and the port bound when
// port 0 was asked for. Does no name lookup on the calling thread.
void StartMetricsServerFromEnv(const Allocator* allocator, const char* who);

// The port the process's BUCKETALLOC_METRICS_ADDR server listens on, or FailedPrecondition naming
// why none is served: the variable is not set (or was not when the allocator was created), the
// allocator (which starts the server) does not exist yet, the host name is still being resolved,
// the address or the bind failed, or this is a child of fork. Never starts anything.
absl::StatusOr<int> ProcessMetricsPort();

}  // namespace bucketalloc::plugins

#endif  // BUCKETALLOC_PLUGINS_COMMON_METRICS_SERVER_H_
