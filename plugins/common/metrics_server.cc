// plugins/common/metrics_server.cc — the /metrics endpoint (plugins/common/metrics_server.h).
#include "plugins/common/metrics_server.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "bucketalloc/metrics.h"
#include "bucketalloc/options.h"

namespace bucketalloc::plugins {
namespace {

using Clock = std::chrono::steady_clock;

constexpr int kIdleMs = 2000;             // reading or writing: no byte moved for this long, dropped
constexpr int kRequestDeadlineMs = 5000;  // the whole request head within this long
constexpr int kAnswerDeadlineMs = 10000;  // the whole answer read by the client within this long
constexpr int kDrainMs = 1000;            // after the answer: what the client still sends, until it closes
constexpr int kAcceptBackoffMs = 100;     // out of file descriptors: the next accept after this long
constexpr int kAcceptsPerWake = 64;       // connections accepted per turn of the loop
static_assert(kIdleMs < kRequestDeadlineMs && kRequestDeadlineMs < kAnswerDeadlineMs);

absl::Status BadAddress(absl::string_view addr, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("bucketalloc: metrics address \"", addr, "\" ", why,
                                                 "; accepted: HOST:PORT or [IPv6]:PORT, e.g. 127.0.0.1:9400 "
                                                 "(port 0 to 65535; 0 picks a free one)"));
}

// Splits "HOST:PORT" / "[V6]:PORT".
absl::Status SplitAddress(absl::string_view addr, std::string* host, std::string* port, bool* bracketed) {
  std::size_t colon = addr.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return BadAddress(addr, "has no HOST:PORT form");
  absl::string_view h = addr.substr(0, colon);
  *bracketed = absl::StartsWith(h, "[");
  if (*bracketed) {
    if (!absl::EndsWith(h, "]") || h.size() < 3) return BadAddress(addr, "has an unclosed [IPv6] host");
    h = h.substr(1, h.size() - 2);
  }
  int number = 0;
  const absl::string_view p = addr.substr(colon + 1);
  if (!absl::SimpleAtoi(p, &number) || number < 0 || number > 65535) {
    return BadAddress(addr, "has no port number");
  }
  *host = std::string(h);
  *port = std::string(p);
  return absl::OkStatus();
}

// The first address of `found` that binds and listens: its socket (non-blocking, close-on-exec),
// or the OS's reason for the last one that did not.
absl::StatusOr<int> BindListening(const addrinfo* found, absl::string_view addr) {
  std::string error = "no address to bind";
  for (const addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    const int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      error = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, SOMAXCONN) == 0) return fd;
    error = std::strerror(errno);
    close(fd);
  }
  return absl::UnavailableError(absl::StrCat("bucketalloc: cannot serve metrics on ", addr, ": ", error));
}

int BoundPort(int fd) {
  sockaddr_storage bound{};
  socklen_t len = sizeof bound;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &len) != 0) return -1;
  return ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
}

int MillisUntil(Clock::time_point t, Clock::time_point now) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count();
  return static_cast<int>(std::clamp<std::int64_t>(ms + 1, 0, 60 * 1000));
}

std::string Response(absl::string_view status, absl::string_view type, absl::string_view extra_headers,
                     const std::string& body, bool head_only) {
  std::string out = absl::StrCat("HTTP/1.1 ", status, "\r\nContent-Type: ", type, "\r\nContent-Length: ", body.size(),
                                 "\r\n", extra_headers, "Connection: close\r\n\r\n");
  if (!head_only) out += body;
  return out;
}

std::string ErrorResponse(absl::string_view status, absl::string_view extra_headers, absl::string_view text) {
  return Response(status, "text/plain; charset=utf-8", extra_headers, absl::StrCat("bucketalloc: ", text, "\n"),
                  /*head_only=*/false);
}

// Where the request head ends (after its blank line), or npos while it has not.
std::size_t HeadEnd(const std::string& in) {
  const std::size_t crlf = in.find("\r\n\r\n");
  const std::size_t lf = in.find("\n\n");
  if (crlf == std::string::npos && lf == std::string::npos) return std::string::npos;
  return std::min(crlf == std::string::npos ? std::string::npos : crlf + 4,
                  lf == std::string::npos ? std::string::npos : lf + 2);
}

}  // namespace

struct MetricsServer::Connection {
  enum class Phase { kRequest, kAnswer, kDrain };
  int fd = -1;
  std::size_t slot = 0;
  Phase phase = Phase::kRequest;
  std::string in;   // the request head read so far
  std::string out;  // the answer
  std::size_t sent = 0;
  Clock::time_point phase_start;    // when the phase began
  Clock::time_point last_progress;  // when a byte last moved
  bool closed = false;

  Clock::time_point Deadline() const {
    switch (phase) {
      case Phase::kRequest:
        return std::min(last_progress + std::chrono::milliseconds(kIdleMs),
                        phase_start + std::chrono::milliseconds(kRequestDeadlineMs));
      case Phase::kAnswer:
        return std::min(last_progress + std::chrono::milliseconds(kIdleMs),
                        phase_start + std::chrono::milliseconds(kAnswerDeadlineMs));
      case Phase::kDrain:
        break;
    }
    return phase_start + std::chrono::milliseconds(kDrainMs);
  }
};

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(absl::string_view addr,
                                                                    std::function<std::string()> render,
                                                                    OnBound on_bound) {
  std::string host, port;
  bool bracketed = false;
  if (absl::Status s = SplitAddress(addr, &host, &port, &bracketed); !s.ok()) return s;
  // A numeric host binds here; nothing of it waits on the network.
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV | AI_NUMERICHOST;
  addrinfo* found = nullptr;
  const int e = getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
  int fd = -1;
  if (e == 0) {
    absl::StatusOr<int> bound = BindListening(found, addr);
    freeaddrinfo(found);
    if (!bound.ok()) return bound.status();
    fd = *bound;
  } else if (e != EAI_NONAME || bracketed) {
    return BadAddress(addr, absl::StrCat("has no usable host (", gai_strerror(e), ")"));
  }
  // else a host name: resolved and bound on the server's thread.
  std::unique_ptr<MetricsServer> server;
  try {
    server.reset(new MetricsServer(std::string(addr), fd, host, port, std::move(render), std::move(on_bound)));
  } catch (...) {
    if (fd >= 0) close(fd);
    throw;
  }
  return server;
}

MetricsServer::MetricsServer(std::string addr, int fd, std::string host, std::string service,
                             std::function<std::string()> render, OnBound on_bound)
    : addr_(std::move(addr)),
      host_(std::move(host)),
      service_(std::move(service)),
      render_(std::move(render)),
      on_bound_(std::move(on_bound)),
      listen_fd_(fd) {
  for (std::atomic<int>& c : clients_) c.store(-1, std::memory_order_relaxed);
  if (fd >= 0) port_.store(BoundPort(fd), std::memory_order_release);
  const int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (wake < 0) throw std::runtime_error(absl::StrCat("cannot create an eventfd: ", std::strerror(errno)));
  wake_fd_.store(wake);
  spare_fd_.store(open("/dev/null", O_RDONLY | O_CLOEXEC));  // before the process may run out
  try {
    thread_ = std::thread([this] { Run(); });
  } catch (...) {
    close(wake);
    if (const int spare = spare_fd_.load(); spare >= 0) close(spare);
    throw;
  }
}

MetricsServer::~MetricsServer() {
  stopping_.store(true);
  const std::uint64_t one = 1;
  (void)!write(wake_fd_.load(), &one, sizeof one);
  thread_.join();
  for (std::atomic<int>* fd : {&listen_fd_, &wake_fd_, &spare_fd_}) {
    if (const int f = fd->exchange(-1); f >= 0) close(f);
  }
}

absl::Status MetricsServer::status() const {
  if (port() >= 0) return absl::OkStatus();
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.empty()) return absl::UnavailableError(failure_);
  return absl::UnavailableError(
      absl::StrCat("bucketalloc: the metrics server of ", addr_, " is still resolving the host name ", host_));
}

void MetricsServer::CloseAfterFork() {
  for (std::atomic<int>* fd : {&listen_fd_, &wake_fd_, &spare_fd_}) {
    if (const int f = fd->exchange(-1); f >= 0) close(f);
  }
  for (std::atomic<int>& c : clients_) {
    if (const int f = c.exchange(-1); f >= 0) close(f);
  }
  port_.store(-1);
}

void MetricsServer::Run() {
  if (listen_fd_.load() < 0 && !BindOnThisThread()) return;
  Serve();
}

bool MetricsServer::BindOnThisThread() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  absl::Status status;
  if (int e = getaddrinfo(host_.c_str(), service_.c_str(), &hints, &found); e != 0) {
    status = absl::UnavailableError(absl::StrCat("bucketalloc: cannot serve metrics on ", addr_, ": the host ", host_,
                                                 " does not resolve (", gai_strerror(e), ")"));
  } else {
    absl::StatusOr<int> bound = BindListening(found, addr_);
    freeaddrinfo(found);
    if (bound.ok()) {
      listen_fd_.store(*bound);
      port_.store(BoundPort(*bound), std::memory_order_release);
    } else {
      status = bound.status();
    }
  }
  if (!status.ok()) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = std::string(status.message());
  }
  if (on_bound_ && !stopping_.load()) on_bound_(status, port());
  return status.ok();
}

void MetricsServer::Close(Connection& c) {
  if (c.closed) return;
  c.closed = true;
  clients_[c.slot].store(-1);  // before the close: a fork's child must not close a reused number
  close(c.fd);
}

void MetricsServer::Serve() {
  std::vector<Connection> conns;  // oldest first
  conns.reserve(kMaxConnections);
  std::vector<pollfd> fds;
  fds.reserve(kMaxConnections + 2);
  Clock::time_point accept_resume{};  // out of file descriptors: no accept before this
  while (!stopping_.load()) {
    Clock::time_point now = Clock::now();
    for (Connection& c : conns) {
      if (c.Deadline() <= now) Close(c);  // silent, slow, or not reading its answer
    }
    std::erase_if(conns, [](const Connection& c) { return c.closed; });
    // Accepting when full drops the oldest connection still waiting for its request (or done).
    const bool room = conns.size() < kMaxConnections ||
                      std::any_of(conns.begin(), conns.end(),
                                  [](const Connection& c) { return c.phase != Connection::Phase::kAnswer; });
    const bool accepting = room && now >= accept_resume && listen_fd_.load() >= 0;
    fds.clear();
    fds.push_back({wake_fd_.load(), POLLIN, 0});
    fds.push_back({accepting ? listen_fd_.load() : -1, POLLIN, 0});
    Clock::time_point next = now + std::chrono::seconds(60);
    if (room && !accepting && accept_resume != Clock::time_point::max()) next = std::min(next, accept_resume);
    for (const Connection& c : conns) {
      fds.push_back({c.fd, static_cast<short>(c.phase == Connection::Phase::kAnswer ? POLLOUT : POLLIN), 0});
      next = std::min(next, c.Deadline());
    }
    const int n = poll(fds.data(), fds.size(), MillisUntil(next, now));
    if (n < 0) {
      if (errno == EINTR) continue;
      std::this_thread::sleep_for(std::chrono::milliseconds(kAcceptBackoffMs));  // ENOMEM: try again
      continue;
    }
    if (fds[0].revents != 0) break;  // the destructor
    for (std::size_t i = 0; i < conns.size(); ++i) {
      Connection& c = conns[i];
      if (fds[i + 2].revents == 0) continue;
      const bool keep = c.phase == Connection::Phase::kAnswer ? Write(c) : Read(c);
      if (!keep) Close(c);
    }
    std::erase_if(conns, [](const Connection& c) { return c.closed; });
    if (fds[1].revents == 0) continue;
    // Accept what is pending.
    for (int k = 0; k < kAcceptsPerWake; ++k) {
      if (conns.size() >= kMaxConnections) {
        auto idle = std::find_if(conns.begin(), conns.end(),
                                 [](const Connection& c) { return c.phase != Connection::Phase::kAnswer; });
        if (idle == conns.end()) break;
        Close(*idle);
        conns.erase(idle);
      }
      const int fd = accept4(listen_fd_.load(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
      if (fd < 0) {
        const int err = errno;
        // accept(2) passes on a pending connection's network error (Linux): that connection is
        // gone, the next may be fine.
        if (err == EINTR || err == ECONNABORTED || err == EPROTO || err == ENETDOWN || err == ENOPROTOOPT ||
            err == EHOSTDOWN || err == ENONET || err == EHOSTUNREACH || err == EOPNOTSUPP || err == ENETUNREACH ||
            err == EPERM) {
          continue;
        }
        if (err == EAGAIN || err == EWOULDBLOCK) break;  // nothing more pending
        if (err != EMFILE && err != ENFILE && err != ENOBUFS && err != ENOMEM) {
          // The socket itself is broken (EBADF, EINVAL, ENOTSOCK, EFAULT): nothing more to accept.
          accept_resume = Clock::time_point::max();
          std::fprintf(stderr,
                       "bucketalloc: metrics server on %s (port %d): cannot accept connections: %s; metrics "
                       "are no longer served\n",
                       addr_.c_str(), port(), std::strerror(err));
          break;
        }
        // No descriptor for the connection: close the pending ones through the spare one (their
        // clients learn at once instead of waiting), and try again later, not in a busy loop.
        if (const int spare = spare_fd_.exchange(-1); spare >= 0) {
          close(spare);
          for (int shed = 0; shed < kAcceptsPerWake; ++shed) {
            const int pending = accept4(listen_fd_.load(), nullptr, nullptr, SOCK_CLOEXEC);
            if (pending < 0) break;
            close(pending);
          }
          spare_fd_.store(open("/dev/null", O_RDONLY | O_CLOEXEC));
        }
        accept_resume = Clock::now() + std::chrono::milliseconds(kAcceptBackoffMs);
        if (!reported_no_fds_) {
          reported_no_fds_ = true;
          std::fprintf(stderr,
                       "bucketalloc: metrics server on %s (port %d): cannot accept a connection: %s; while the "
                       "process has no free file descriptor, connections are closed unanswered (tried again every "
                       "%d ms; reported once)\n",
                       addr_.c_str(), port(), std::strerror(err), kAcceptBackoffMs);
        }
        break;
      }
      if (spare_fd_.load() < 0) spare_fd_.store(open("/dev/null", O_RDONLY | O_CLOEXEC));  // again
      std::size_t slot = 0;
      while (slot < kMaxConnections && clients_[slot].load(std::memory_order_relaxed) >= 0) ++slot;
      if (slot == kMaxConnections) {  // cannot happen: one slot per connection
        close(fd);
        break;
      }
      clients_[slot].store(fd);
      Connection c;
      c.fd = fd;
      c.slot = slot;
      c.phase_start = c.last_progress = Clock::now();
      conns.push_back(std::move(c));
    }
  }
  for (Connection& c : conns) Close(c);
}

bool MetricsServer::Read(Connection& c) {
  char buf[4096];
  for (;;) {
    std::size_t want = sizeof buf;
    if (c.phase == Connection::Phase::kRequest) want = std::min(want, kMaxRequestBytes - c.in.size());
    const ssize_t n = recv(c.fd, buf, want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    if (n == 0) return false;  // the client is done (or gave up before its request was whole)
    c.last_progress = Clock::now();
    if (c.phase == Connection::Phase::kDrain) continue;  // what follows the request: not read
    c.in.append(buf, static_cast<std::size_t>(n));
    if (HeadEnd(c.in) != std::string::npos || c.in.size() >= kMaxRequestBytes) {
      Answer(c);
      return Write(c);
    }
  }
}

bool MetricsServer::Write(Connection& c) {
  while (c.sent < c.out.size()) {
    const ssize_t n = send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    c.sent += static_cast<std::size_t>(n);
    c.last_progress = Clock::now();
  }
  // All sent: the client reads to the end; what it still sends is read and dropped until it
  // closes (closing with unread bytes would reset the connection and could lose the answer).
  shutdown(c.fd, SHUT_WR);
  c.out.clear();
  c.out.shrink_to_fit();
  c.phase = Connection::Phase::kDrain;
  c.phase_start = Clock::now();
  return true;
}

void MetricsServer::Answer(Connection& c) {
  c.phase = Connection::Phase::kAnswer;
  c.phase_start = c.last_progress = Clock::now();
  const std::size_t eol = c.in.find('\n');
  if (eol == std::string::npos) {
    c.out = ErrorResponse(
        "414 URI Too Long", "",
        absl::StrCat("the request line is longer than ", kMaxRequestBytes, " bytes; accepted: GET /metrics HTTP/1.1"));
    return;
  }
  const absl::string_view line = absl::StripSuffix(absl::string_view(c.in).substr(0, eol), "\r");
  const std::vector<absl::string_view> parts = absl::StrSplit(line, ' ');
  if (parts.size() != 3 || parts[0].empty() || !absl::StartsWith(parts[1], "/") ||
      !absl::StartsWith(parts[2], "HTTP/")) {
    c.out = ErrorResponse("400 Bad Request", "", "not an HTTP request line; accepted: GET /metrics HTTP/1.1");
    return;
  }
  if (HeadEnd(c.in) == std::string::npos) {
    c.out = ErrorResponse("431 Request Header Fields Too Large", "",
                          absl::StrCat("the request head is longer than ", kMaxRequestBytes, " bytes"));
    return;
  }
  const absl::string_view method = parts[0];
  if (method != "GET" && method != "HEAD") {
    c.out = ErrorResponse("405 Method Not Allowed", "Allow: GET, HEAD\r\n",
                          absl::StrCat("method ", method, " is not served; accepted: GET or HEAD /metrics"));
    return;
  }
  const absl::string_view path = parts[1].substr(0, parts[1].find('?'));
  if (path != "/metrics" && path != "/") {
    c.out = ErrorResponse("404 Not Found", "", absl::StrCat("no ", path, " here; the metrics are at /metrics"));
    return;
  }
  std::string body;
  try {
    body = render_();
  } catch (const std::exception& e) {  // no memory for the text
    c.out = ErrorResponse("500 Internal Server Error", "", absl::StrCat("cannot render the metrics: ", e.what()));
    return;
  }
  c.out = Response("200 OK", kPrometheusContentType, "", body, method == "HEAD");
}

namespace {

// The process's server and how starting it went, read without a lock (a child of fork may ask).
std::atomic<MetricsServer*> g_server{nullptr};             // leaked: lives as long as the process
std::atomic<const std::string*> g_start_failure{nullptr};  // leaked
std::atomic<int> g_env_state{0};  // 0: not asked yet; 1: the allocator was created without the variable; 2: asked
std::atomic<bool> g_fork_child{false};

}  // namespace

void StartMetricsServerFromEnv(const Allocator* allocator, const char* who) {
  if (allocator == nullptr) return;
  const char* addr = ReadEnv("BUCKETALLOC_METRICS_ADDR");
  if (addr == nullptr) {
    int not_asked = 0;
    g_env_state.compare_exchange_strong(not_asked, 1);
    return;
  }
  static const bool started = [&] {
    g_env_state.store(2);
    const std::string name = who, value = addr;
    auto report = [name, value](absl::string_view why) {
      std::fprintf(stderr, "%s: BUCKETALLOC_METRICS_ADDR=%s: %s; metrics are not served (nothing else changes)\n",
                   name.c_str(), value.c_str(), std::string(absl::StripPrefix(why, "bucketalloc: ")).c_str());
    };
    // Port 0: the one line that says which port was bound.
    const std::size_t colon = value.rfind(':');
    int asked = -1;
    if (colon != std::string::npos && !absl::SimpleAtoi(absl::string_view(value).substr(colon + 1), &asked)) asked = -1;
    auto say_port = [name, value, asked, colon](int port) {
      if (asked != 0) return;
      std::fprintf(stderr, "%s: BUCKETALLOC_METRICS_ADDR=%s: serving metrics on port %d (http://%s:%d/metrics)\n",
                   name.c_str(), value.c_str(), port, value.substr(0, colon).c_str(), port);
    };
    try {
      absl::StatusOr<std::unique_ptr<MetricsServer>> server = MetricsServer::Start(
          addr, [allocator] { return MetricsToPrometheus(allocator->Metrics()); },
          [report, say_port](const absl::Status& s, int port) {  // a host name, on the server's thread
            if (s.ok()) {
              say_port(port);
            } else {
              report(s.message());
            }
          });
      if (!server.ok()) {
        g_start_failure.store(new std::string(server.status().message()));
        report(server.status().message());
        return false;
      }
      // Lives as long as the process, as the allocator does. A child of fork has no server thread:
      // it closes the sockets, so that the port is free again when the parent ends.
      MetricsServer* s = server->release();
      g_server.store(s);
      pthread_atfork(nullptr, nullptr, [] {
        g_fork_child.store(true);
        if (MetricsServer* mine = g_server.load()) mine->CloseAfterFork();
      });
      if (const int port = s->port(); port >= 0) say_port(port);
      return true;
    } catch (const std::exception& e) {  // no thread or no memory for it
      g_start_failure.store(new std::string(absl::StrCat("bucketalloc: cannot start the metrics server: ", e.what())));
      report(e.what());
      return false;
    }
  }();
  (void)started;
}

absl::StatusOr<int> ProcessMetricsPort() {
  if (g_fork_child.load()) {
    return absl::FailedPreconditionError(
        "bucketalloc: no metrics server in this process: it is a child of fork, and the server of "
        "BUCKETALLOC_METRICS_ADDR is its parent's");
  }
  if (const MetricsServer* s = g_server.load()) {
    if (const int port = s->port(); port >= 0) return port;
    const absl::Status status = s->status();
    // The bind may have completed between the two reads: its port, then.
    if (const int port = s->port(); port >= 0) return port;
    return absl::FailedPreconditionError(status.message());
  }
  if (const std::string* failure = g_start_failure.load()) return absl::FailedPreconditionError(*failure);
  switch (g_env_state.load()) {
    case 1:
      return absl::FailedPreconditionError(
          "bucketalloc: no metrics server: BUCKETALLOC_METRICS_ADDR was not set when the allocator was created; "
          "set it to HOST:PORT (e.g. 127.0.0.1:0) before the first allocation");
    case 2:
      return absl::FailedPreconditionError("bucketalloc: the metrics server is starting; ask again");
    default:
      break;
  }
  if (const char* addr = ReadEnv("BUCKETALLOC_METRICS_ADDR"); addr != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("bucketalloc: no metrics server yet: the server of BUCKETALLOC_METRICS_ADDR=", addr,
                     " starts with the allocator, at the first allocation"));
  }
  return absl::FailedPreconditionError(
      "bucketalloc: no metrics server: BUCKETALLOC_METRICS_ADDR is not set; set it to HOST:PORT (e.g. "
      "127.0.0.1:0) before the first allocation");
}

}  // namespace bucketalloc::plugins
