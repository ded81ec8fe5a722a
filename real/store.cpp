#include "real/store.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include "real/backend.hpp"
#include "real/executor.hpp"
#include "sim/error.hpp"

namespace hpz::real {
namespace {

// Wire format, one request after another on a connection:
//   set: 'S' u32 key_len, key, i32 reads, u64 value_len, value      (no reply)
//   get: 'G' u32 key_len, key                                        reply: u64 value_len, value
//   bye: 'B' u32 0                                                   (no reply; the client is done)
constexpr char kSet = 'S';
constexpr char kGet = 'G';
constexpr char kBye = 'B';
// Keys and values are small; a length beyond this is a corrupt stream, not a value.
constexpr std::uint64_t kMaxLength = std::uint64_t{1} << 34;
constexpr std::uint32_t kMaxKey = 4096;

std::string errno_text() {
  return std::strerror(errno);
}

/** Reads exactly n bytes; false on end of stream or error. */
bool read_exact(int fd, void* data, std::size_t n) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
  }
  return true;
}

bool write_exact(int fd, const void* data, std::size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t put = ::send(fd, p, n, MSG_NOSIGNAL);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return true;
}

}  // namespace

/** Rank 0's side: one thread accepts, one thread per connection answers its requests. It
 *  outlives rank 0's own work until every rank has said goodbye (or the timeout passed), so
 *  that no rank loses the store while it still reads the last values. */
class StoreServer {
 public:
  StoreServer(int port, int world, double timeout_s) : world_(world), timeout_s_(timeout_s) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd_ < 0) throw std::runtime_error("store: socket: " + errno_text());
    const int one = 1;
    ::setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::listen(listen_fd_, 128) != 0) {
      const std::string why = errno_text();
      ::close(listen_fd_);
      // A port in use or not ours to bind is the user's setting, not a bug of hpzlab.
      throw InputError("environment", "MASTER_PORT",
                       fmt::format("rank 0 cannot serve its store on port {}: {} (allowed: a "
                                   "free port, 1 to 65535)",
                                   port, why));
    }
    socklen_t len = sizeof a;
    ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~StoreServer() {
    {
      std::unique_lock lock(mu_);
      cv_.wait_for(lock, std::chrono::duration<double>(timeout_s_),
                   [&] { return byes_ >= world_; });
      stop_ = true;
      for (int fd : fds_) ::shutdown(fd, SHUT_RDWR);
    }
    cv_.notify_all();
    ::shutdown(listen_fd_, SHUT_RDWR);
    ::close(listen_fd_);
    accept_thread_.join();
    for (std::thread& t : conns_) t.join();
    for (int fd : fds_) ::close(fd);
  }

  int port() const { return port_; }

 private:
  struct Entry {
    std::string value;
    int reads_left = 0;
  };

  void accept_loop() {
    for (;;) {
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        if (errno == EINTR) continue;
        return;  // the listening socket was shut down
      }
      const int one = 1;  // replies go out in two writes: no Nagle delay between them
      ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      std::lock_guard lock(mu_);
      if (stop_) {
        ::close(fd);
        return;
      }
      fds_.push_back(fd);
      conns_.emplace_back([this, fd] { serve(fd); });
    }
  }

  void serve(int fd) {
    for (;;) {
      char op = 0;
      std::uint32_t key_len = 0;
      if (!read_exact(fd, &op, 1) || !read_exact(fd, &key_len, sizeof key_len)) return;
      if (key_len > kMaxKey) return;
      std::string key(key_len, '\0');
      if (!read_exact(fd, key.data(), key_len)) return;
      if (op == kSet) {
        std::int32_t reads = 0;
        std::uint64_t n = 0;
        if (!read_exact(fd, &reads, sizeof reads) || !read_exact(fd, &n, sizeof n) ||
            n > kMaxLength) {
          return;
        }
        std::string value(n, '\0');
        if (!read_exact(fd, value.data(), n)) return;
        {
          std::lock_guard lock(mu_);
          data_[key] = {std::move(value), reads};
        }
        cv_.notify_all();
      } else if (op == kGet) {
        std::string value;
        {
          std::unique_lock lock(mu_);
          cv_.wait(lock, [&] { return stop_ || data_.count(key) > 0; });
          if (stop_) return;
          auto it = data_.find(key);
          value = it->second.value;
          if (--it->second.reads_left <= 0) data_.erase(it);
        }
        const std::uint64_t n = value.size();
        if (!write_exact(fd, &n, sizeof n) || !write_exact(fd, value.data(), n)) return;
      } else {
        if (op == kBye) {
          std::lock_guard lock(mu_);
          ++byes_;
          cv_.notify_all();
        }
        return;
      }
    }
  }

  int world_;
  double timeout_s_;
  int byes_ = 0;
  int listen_fd_ = -1;
  int port_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Entry> data_;
  bool stop_ = false;
  std::vector<int> fds_;
  std::vector<std::thread> conns_;
  std::thread accept_thread_;
};

Store::Store(int rank, int world, const std::string& addr, int port, double timeout_s)
    : rank_(rank), world_(world), port_(port), addr_(addr), timeout_s_(timeout_s) {
  if (rank == 0) {
    server_ = std::make_unique<StoreServer>(port, world, timeout_s);
    port_ = server_->port();
  }
  connect_to_server();
}

void Store::connect_to_server() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port_);
  if (const int err = ::getaddrinfo(addr_.c_str(), service.c_str(), &hints, &found); err != 0) {
    throw InputError("environment", "MASTER_ADDR",
                     fmt::format("cannot resolve '{}': {} (allowed: rank 0's host name or "
                                 "address)",
                                 shown(addr_), gai_strerror(err)));
  }
  const auto deadline = now_s() + timeout_s_;
  // Rank 0 may not be serving yet: retry until it is, or until the deadline.
  for (;;) {
    for (addrinfo* ai = found; ai != nullptr && fd_ < 0; ai = ai->ai_next) {
      const int fd = ::socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
      if (fd < 0) continue;
      if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        fd_ = fd;
      } else {
        ::close(fd);
      }
    }
    if (fd_ >= 0 || now_s() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::freeaddrinfo(found);
  if (fd_ < 0) {
    broken_ = true;
    throw HangError(fmt::format("HANG: rank {} could not reach rank 0's store at {}:{} in {:g} s",
                                rank_, addr_, port_, timeout_s_));
  }
  broken_ = false;
  const int one = 1;
  ::setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

Store::~Store() {
  if (fd_ < 0) return;
  if (!broken_) {
    const char bye[1 + sizeof(std::uint32_t)] = {kBye, 0, 0, 0, 0};
    write_exact(fd_, bye, sizeof bye);  // best effort: rank 0 stops waiting for this rank
  }
  ::close(fd_);
}

void Store::send_all(const void* data, std::size_t n) {
  if (!write_exact(fd_, data, n)) {
    broken_ = true;
    throw std::runtime_error(
        fmt::format("store: rank {} lost its connection: {}", rank_, errno_text()));
  }
}

void Store::recv_all(void* data, std::size_t n) {
  const double deadline = now_s() + timeout_s_;
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    pollfd pfd{fd_, POLLIN, 0};
    const double left = deadline - now_s();
    const int ready = left > 0 ? ::poll(&pfd, 1, static_cast<int>(left * 1e3) + 1) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) {
      // The reply may still come: a fresh connection keeps it from being read as the answer
      // to a later request (the server drops the old one when it writes to it).
      ::close(fd_);
      fd_ = -1;
      connect_to_server();
      throw HangError(fmt::format(
          "HANG: rank {} waited {:g} s for the other ranks at the store (a rank stopped or "
          "never issued its part)",
          rank_, timeout_s_));
    }
    const ssize_t got = ::recv(fd_, p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      broken_ = true;
      throw std::runtime_error(fmt::format("store: rank {} lost its connection to rank 0", rank_));
    }
    p += got;
    n -= static_cast<std::size_t>(got);
  }
}

void Store::set(const std::string& key, const std::string& value, int reads) {
  std::lock_guard lock(mu_);
  if (broken_) throw std::runtime_error("store: the connection to rank 0 is lost");
  const auto key_len = static_cast<std::uint32_t>(key.size());
  const std::int32_t r = reads;
  const std::uint64_t n = value.size();
  std::string msg(1, kSet);
  msg.append(reinterpret_cast<const char*>(&key_len), sizeof key_len).append(key);
  msg.append(reinterpret_cast<const char*>(&r), sizeof r);
  msg.append(reinterpret_cast<const char*>(&n), sizeof n);
  send_all(msg.data(), msg.size());
  send_all(value.data(), value.size());
}

std::string Store::get(const std::string& key) {
  std::lock_guard lock(mu_);
  if (broken_) throw std::runtime_error("store: the connection to rank 0 is lost");
  const auto key_len = static_cast<std::uint32_t>(key.size());
  std::string msg(1, kGet);
  msg.append(reinterpret_cast<const char*>(&key_len), sizeof key_len).append(key);
  send_all(msg.data(), msg.size());
  std::uint64_t n = 0;
  recv_all(&n, sizeof n);
  if (n > kMaxLength) throw std::runtime_error("store: corrupt reply");
  std::string value(n, '\0');
  recv_all(value.data(), n);
  return value;
}

std::vector<std::string> Store::all_gather(const std::string& key, const std::string& value) {
  if (world_ > 1) set(fmt::format("{}/{}", key, rank_), value, world_ - 1);
  std::vector<std::string> out(static_cast<std::size_t>(world_));
  for (int r = 0; r < world_; ++r) {
    out[static_cast<std::size_t>(r)] = r == rank_ ? value : get(fmt::format("{}/{}", key, r));
  }
  return out;
}

void Store::barrier(const std::string& key) {
  all_gather(key, {});
}

}  // namespace hpz::real
