// A small TCP key-value store for runs with one process per rank: it hands NCCL's unique id
// from rank 0 to every rank, lines the processes up (barriers), gathers every rank's results,
// and carries the host backend's collectives when no GPU is involved. Rank 0 serves it from a
// thread of its own; every rank, rank 0 too, is a client. The same idea as PyTorch's TCPStore,
// sized for a few dozen processes and small values.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace hpz::real {

class StoreServer;

class Store {
 public:
  /** Connects rank `rank` of `world` to the store at addr:port; rank 0 starts serving it first
   *  (port 0: any free port, see port()). Gives up with HangError after `timeout_s`, and
   *  throws std::runtime_error when the address is bad or the port is taken. */
  Store(int rank, int world, const std::string& addr, int port, double timeout_s);
  ~Store();
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }
  /** The port served (rank 0) or connected to. */
  int port() const { return port_; }

  /** Stores `value` under `key`; the store forgets it after `reads` gets. */
  void set(const std::string& key, const std::string& value, int reads);
  /** The value under `key`, waiting until some rank sets it; HangError after the timeout. */
  std::string get(const std::string& key);
  /** Every rank's `value`, in rank order; every rank must call it with the same `key`. */
  std::vector<std::string> all_gather(const std::string& key, const std::string& value);
  /** Returns once every rank has reached the barrier named `key`. */
  void barrier(const std::string& key);

 private:
  void connect_to_server();
  void send_all(const void* data, std::size_t n);
  void recv_all(void* data, std::size_t n);

  int rank_;
  int world_;
  int port_;
  std::string addr_;
  double timeout_s_;
  int fd_ = -1;
  bool broken_ = false;  ///< the connection is lost
  std::mutex mu_;
  std::unique_ptr<StoreServer> server_;
};

}  // namespace hpz::real
