// The /metrics endpoint (plugins/common/metrics_server.cc): what GET /metrics, other paths,
// other methods and malformed requests get; idle, slow and many concurrent clients do not delay a
// scrape; a process out of file descriptors does not make the thread spin; a host name is resolved
// on the server's thread; addresses refused with what is accepted; the server stops when destroyed.
#include "plugins/common/metrics_server.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

// The test's resolver, in front of the C library's: "slow.test" takes 1 s on the calling thread (a
// silent DNS server) and is 127.0.0.1; "fail.test" does not resolve.
namespace {
std::atomic<bool> g_slow_lookup_on_main_thread{false};
pthread_t g_main_thread;
}  // namespace

extern "C" int getaddrinfo(const char* node, const char* service, const struct addrinfo* hints, struct addrinfo** res) {
  using Fn = int (*)(const char*, const char*, const struct addrinfo*, struct addrinfo**);
  static const Fn real = reinterpret_cast<Fn>(dlsym(RTLD_NEXT, "getaddrinfo"));
  if (node != nullptr && std::strcmp(node, "fail.test") == 0) return EAI_NONAME;
  if (node != nullptr && std::strcmp(node, "slow.test") == 0) {
    if (hints != nullptr && (hints->ai_flags & AI_NUMERICHOST) != 0) return EAI_NONAME;
    if (pthread_equal(pthread_self(), g_main_thread)) g_slow_lookup_on_main_thread = true;
    std::this_thread::sleep_for(std::chrono::seconds(1));
    node = "127.0.0.1";
  }
  return real(node, service, hints, res);
}

namespace bucketalloc::plugins {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

sockaddr_in Loopback(int port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

// A connection to 127.0.0.1:port that sends nothing (connected without waiting for the accept).
int IdleConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a = Loopback(port);
  connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);  // EINPROGRESS at most, on loopback
  return fd;
}

// Connects to 127.0.0.1:port, sends `request` and returns everything the server answers within
// `timeout_s` (a server that does not answer in time gives what came until then).
std::string Exchange(int port, const std::string& request, int timeout_s = 10) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  const timeval timeout{timeout_s, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
  sockaddr_in a = Loopback(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return "connect failed";
  }
  send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  close(fd);
  return out;
}

TEST(MetricsServerTest, ServesTheRenderedTextAtMetrics) {
  std::atomic<int> renders{0};
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [&] {
    ++renders;
    return std::string("# TYPE bucketalloc_x gauge\nbucketalloc_x{device=\"0\"} 1\n");
  });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  ASSERT_GT(port, 0);
  const std::string ok = Exchange(port, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(ok, "HTTP/1.1 200 OK\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n")) << ok;
  EXPECT_TRUE(absl::StrContains(ok, "Content-Length: 55\r\n")) << ok;
  EXPECT_TRUE(absl::EndsWith(ok, "\r\n\r\n# TYPE bucketalloc_x gauge\nbucketalloc_x{device=\"0\"} 1\n")) << ok;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics?name[]=x HTTP/1.1\r\n\r\n"), "HTTP/1.1 200"));
  const std::string head = Exchange(port, "HEAD /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::EndsWith(head, "\r\n\r\n")) << "no body for HEAD: " << head;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /other HTTP/1.1\r\n\r\n"), "HTTP/1.1 404 Not Found"));
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 405"));
  EXPECT_EQ(renders.load(), 3) << "only GET and HEAD of /metrics render";
}

// Issue 27 (14): a request line that is not HTTP was 405 "only GET /metrics", as was an overlong
// one; a 405 carried no Allow header.
TEST(MetricsServerTest, MalformedRequestsGet400Or414Or431And405SaysWhatIsAllowed) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  for (const char* bad : {"hello\r\n\r\n", "GET\r\n\r\n", "GET /metrics\r\n\r\n", "GET metrics HTTP/1.1\r\n\r\n",
                          "GET /metrics HTTP/1.1 extra\r\n\r\n"}) {
    EXPECT_TRUE(absl::StartsWith(Exchange(port, bad), "HTTP/1.1 400 Bad Request\r\n")) << bad;
  }
  const std::string long_line =
      absl::StrCat("GET /", std::string(MetricsServer::kMaxRequestBytes, 'a'), " HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(Exchange(port, long_line), "HTTP/1.1 414 URI Too Long\r\n"));
  const std::string long_head =
      absl::StrCat("GET /metrics HTTP/1.1\r\nX: ", std::string(MetricsServer::kMaxRequestBytes, 'b'), "\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(Exchange(port, long_head), "HTTP/1.1 431 "));
  const std::string post = Exchange(port, "POST /metrics HTTP/1.1\r\n\r\n");
  EXPECT_TRUE(absl::StartsWith(post, "HTTP/1.1 405 Method Not Allowed\r\n")) << post;
  EXPECT_TRUE(absl::StrContains(post, "\r\nAllow: GET, HEAD\r\n")) << post;
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "HTTP/1.1 200")) << "still serving";
}

// Issue 27 (2): one connection at a time, 2 s per idle client: a scrape waited 9.9 s behind 5 idle
// connections (Prometheus gives up after 10 s).
TEST(MetricsServerTest, AScrapeIsAnsweredAtOnceBehindIdleAndSlowClients) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  std::vector<int> idle;
  for (int i = 0; i < 20; ++i) idle.push_back(IdleConnection(port));
  for (int i = 0; i < 5; ++i) {  // slow: half a request line, and then nothing
    const int fd = IdleConnection(port);
    pollfd p{fd, POLLOUT, 0};
    poll(&p, 1, 1000);
    send(fd, "GET /met", 8, MSG_NOSIGNAL);
    idle.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // all of them connected
  const Clock::time_point start = Clock::now();
  const std::string answer = Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n", /*timeout_s=*/3);
  const double took = SecondsSince(start);
  EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 200 OK")) << answer;
  EXPECT_LT(took, 0.5) << "behind 25 idle or slow connections";
  for (int fd : idle) close(fd);
}

// 200 scrapers at once, all answered; and with more idle connections than the server keeps, a new
// one drops the oldest idle one (the 19th connection was not accepted before).
TEST(MetricsServerTest, TwoHundredConcurrentScrapersAndAFullTableOfIdleOnes) {
  std::atomic<int> renders{0};
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [&] {
    ++renders;
    return std::string("x\n");
  });
  ASSERT_TRUE(s.ok()) << s.status();
  const int port = (*s)->port();
  constexpr int kScrapers = 200;
  std::vector<int> fds;
  for (int i = 0; i < kScrapers; ++i) fds.push_back(IdleConnection(port));
  const std::string request = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";
  std::vector<std::string> answers(kScrapers);
  std::vector<bool> sent(kScrapers, false), done(kScrapers, false);
  const Clock::time_point start = Clock::now();
  int finished = 0;
  while (finished < kScrapers && SecondsSince(start) < 5) {
    std::vector<pollfd> p;
    for (int i = 0; i < kScrapers; ++i)
      p.push_back({done[i] ? -1 : fds[i], static_cast<short>(sent[i] ? POLLIN : POLLOUT), 0});
    poll(p.data(), p.size(), 100);
    for (int i = 0; i < kScrapers; ++i) {
      if (p[i].revents == 0) continue;
      if (!sent[i]) {
        sent[i] = send(fds[i], request.data(), request.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(request.size());
        continue;
      }
      char buf[4096];
      const ssize_t n = recv(fds[i], buf, sizeof buf, 0);
      if (n > 0) {
        answers[i].append(buf, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EAGAIN) {
        done[i] = true;
        ++finished;
      }
    }
  }
  const double took = SecondsSince(start);
  int ok = 0;
  for (int i = 0; i < kScrapers; ++i) {
    ok += absl::StartsWith(answers[i], "HTTP/1.1 200 OK") && absl::EndsWith(answers[i], "\r\n\r\nx\n");
    close(fds[i]);
  }
  EXPECT_EQ(ok, kScrapers) << "in " << took << " s";
  EXPECT_LT(took, 2.0);
  EXPECT_EQ(renders.load(), kScrapers);

  // More idle connections than it keeps: the oldest are dropped, a scrape is still answered.
  std::vector<int> idle;
  for (std::size_t i = 0; i < MetricsServer::kMaxConnections + 20; ++i) idle.push_back(IdleConnection(port));
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const Clock::time_point scrape = Clock::now();
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n", 3), "HTTP/1.1 200 OK"));
  EXPECT_LT(SecondsSince(scrape), 0.5);
  char byte;
  pollfd first{idle[0], POLLIN, 0};
  ASSERT_EQ(poll(&first, 1, 1000), 1) << "the oldest idle connection is closed";
  EXPECT_EQ(recv(idle[0], &byte, 1, 0), 0);
  for (int fd : idle) close(fd);
}

// Issue 27 (3): out of file descriptors, the thread retried accept4 at once: 3.0 s of CPU in 3 idle
// seconds. In a child whose descriptors are all used, with a connection pending, the process's CPU
// over 1 s stays small; the pending client is closed unanswered; once descriptors are free again a
// scrape is answered.
TEST(MetricsServerTest, OutOfFileDescriptorsTheServerBacksOffAndRecovers) {
  int to_child[2], to_parent[2];
  ASSERT_EQ(pipe(to_child), 0);
  ASSERT_EQ(pipe(to_parent), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(10);
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
    if (!s.ok()) _exit(2);
    const int port = (*s)->port();
    // Every descriptor used.
    const rlimit low{64, 64};
    setrlimit(RLIMIT_NOFILE, &low);
    std::vector<int> fillers;
    for (int fd; (fd = open("/dev/null", O_RDONLY)) >= 0;) fillers.push_back(fd);
    (void)!write(to_parent[1], &port, sizeof port);
    char go;
    (void)!read(to_child[0], &go, 1);  // the parent's connection is pending
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    getrusage(RUSAGE_SELF, &after);
    const auto micros = [](const rusage& r) {
      return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000LL + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
    };
    const int cpu_ms = static_cast<int>((micros(after) - micros(before)) / 1000);
    for (int fd : fillers) close(fd);  // descriptors free again
    (void)!write(to_parent[1], &cpu_ms, sizeof cpu_ms);
    (void)!read(to_child[0], &go, 1);  // the parent scraped
    _exit(0);
  }
  close(to_child[0]);
  close(to_parent[1]);
  int port = 0;
  ASSERT_EQ(read(to_parent[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
  const int pending = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = Loopback(port);
  ASSERT_EQ(connect(pending, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  constexpr absl::string_view kRequest = "GET /metrics HTTP/1.1\r\n\r\n";
  send(pending, kRequest.data(), kRequest.size(), MSG_NOSIGNAL);
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  int cpu_ms = -1;
  ASSERT_EQ(read(to_parent[0], &cpu_ms, sizeof cpu_ms), static_cast<ssize_t>(sizeof cpu_ms));
  EXPECT_LT(cpu_ms, 150) << "CPU of the server's process in 1 s with a connection it cannot accept";
  // The pending client was closed unanswered (not left waiting).
  pollfd p{pending, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 1000), 1);
  char byte;
  EXPECT_LE(recv(pending, &byte, 1, MSG_DONTWAIT), 0);
  close(pending);
  EXPECT_TRUE(absl::StartsWith(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n", 3), "HTTP/1.1 200 OK"))
      << "served again once descriptors are free";
  ASSERT_EQ(write(to_child[1], "g", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  close(to_child[1]);
  close(to_parent[0]);
}

// Issue 27 (4): a host name was resolved inside the first allocation (seconds with a silent
// resolver). Start returns at once; the name is resolved and bound on the server's thread, which
// reports how it went.
TEST(MetricsServerTest, AHostNameIsResolvedOnTheServersThread) {
  g_main_thread = pthread_self();
  std::atomic<int> bound_port{0};
  std::atomic<bool> called{false};
  const Clock::time_point start = Clock::now();
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(
      "slow.test:0", [] { return "x\n"; },
      [&](const absl::Status& status, int port) {
        EXPECT_TRUE(status.ok()) << status;
        bound_port = port;
        called = true;
      });
  EXPECT_LT(SecondsSince(start), 0.5) << "Start waited for the resolver";
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_FALSE(g_slow_lookup_on_main_thread.load());
  EXPECT_EQ((*s)->port(), -1);
  EXPECT_TRUE(absl::StrContains((*s)->status().message(), "still resolving the host name slow.test")) << (*s)->status();
  while (!called.load() && SecondsSince(start) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_TRUE(called.load());
  EXPECT_GT(bound_port.load(), 0);
  EXPECT_EQ((*s)->port(), bound_port.load());
  EXPECT_TRUE((*s)->status().ok());
  EXPECT_TRUE(absl::StartsWith(Exchange((*s)->port(), "GET /metrics HTTP/1.1\r\n\r\n", 3), "HTTP/1.1 200 OK"));

  std::atomic<bool> failed{false};
  absl::StatusOr<std::unique_ptr<MetricsServer>> bad = MetricsServer::Start(
      "fail.test:9400", [] { return ""; },
      [&](const absl::Status& status, int port) {
        EXPECT_TRUE(absl::IsUnavailable(status)) << status;
        EXPECT_TRUE(absl::StrContains(status.message(), "fail.test does not resolve")) << status;
        EXPECT_EQ(port, -1);
        failed = true;
      });
  ASSERT_TRUE(bad.ok()) << bad.status();
  while (!failed.load() && SecondsSince(start) < 5) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_TRUE(failed.load());
  EXPECT_EQ((*bad)->port(), -1);
  EXPECT_TRUE(absl::StrContains((*bad)->status().message(), "does not resolve")) << (*bad)->status();
}

TEST(MetricsServerTest, ASilentClientIsDroppedAndTheNextIsServed) {
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
  ASSERT_TRUE(s.ok()) << s.status();
  const int silent = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<std::uint16_t>((*s)->port()));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(connect(silent, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  // Served after the silent one times out (2 s).
  EXPECT_TRUE(absl::StartsWith(Exchange((*s)->port(), "GET /metrics HTTP/1.0\r\n\r\n"), "HTTP/1.1 200"));
  close(silent);
}

TEST(MetricsServerTest, BadAddressesAreRefusedWithWhatIsAccepted) {
  for (const char* addr :
       {"", "9400", "host", "127.0.0.1:", "127.0.0.1:http", "127.0.0.1:70000", "[::1:9400", "[gpu-17]:9400"}) {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start(addr, [] { return ""; });
    ASSERT_FALSE(s.ok()) << addr;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status())) << addr << ": " << s.status();
    EXPECT_TRUE(absl::StrContains(s.status().message(), "accepted: HOST:PORT or [IPv6]:PORT")) << s.status();
  }
  absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return ""; });
  ASSERT_TRUE(s.ok());
  absl::StatusOr<std::unique_ptr<MetricsServer>> again =
      MetricsServer::Start(absl::StrCat("127.0.0.1:", (*s)->port()), [] { return ""; });
  EXPECT_TRUE(absl::IsUnavailable(again.status())) << again.status();
  EXPECT_TRUE(absl::StrContains(again.status().message(), "in use")) << again.status();
}

TEST(MetricsServerTest, DestroyingItStopsServing) {
  int port = 0;
  {
    absl::StatusOr<std::unique_ptr<MetricsServer>> s = MetricsServer::Start("127.0.0.1:0", [] { return "x\n"; });
    ASSERT_TRUE(s.ok());
    port = (*s)->port();
  }
  EXPECT_EQ(Exchange(port, "GET /metrics HTTP/1.1\r\n\r\n"), "connect failed");
}

}  // namespace
}  // namespace bucketalloc::plugins
