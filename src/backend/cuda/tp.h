// Tensor parallelism machinery of the CUDA backend (issue 8, docs/tp.md): NCCL communicators, the
// exact activation exchanges (all-gathers of column blocks and of expert rows: only copies, never
// sums, so TP=N equals TP=1 bit for bit) and a pool running one thread per rank.
//
// NCCL is loaded at run time (dlopen of libnccl.so.2: $DSUF_NCCL_LIB, the loader's path, then the
// CUDA and pip `nvidia-nccl` locations), so a binary built with TP still starts where NCCL is
// absent and one GPU (world size 1, no collectives) is used.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <cuda_runtime.h>

#include "model/tp_partition.h"

namespace dsuf::cuda {

constexpr int kMaxTpRanks = 16;

// True when nccl.h was found at build time (otherwise more than one GPU is refused at run time).
bool nccl_compiled();

// One rank's NCCL communicator. All ranks of a host are created together by one thread.
class TpComm {
 public:
  // ncclCommInitAll over `devices` (sets NCCL_NVLS_ENABLE=0 first when unset). Throws with the
  // library path tried and NCCL's message when anything fails.
  static std::vector<std::unique_ptr<TpComm>> create_all(const std::vector<int>& devices);
  TpComm(const TpComm&) = delete;
  TpComm& operator=(const TpComm&) = delete;
  ~TpComm();
  int rank() const { return rank_; }
  int world() const { return world_; }
  // recv[world][count] ← every rank's send[count] (in place when send == recv + rank·count).
  void all_gather(const float* send, float* recv, size_t count, cudaStream_t s);
  void broadcast(float* buf, size_t count, int root, cudaStream_t s);  // in place
  void group_start();
  void group_end();
  // Aborts the communicator (unblocks peers waiting in a collective after another rank failed).
  void abort();

 private:
  TpComm() = default;
  void* comm_ = nullptr;
  int rank_ = 0, world_ = 1;
  bool aborted_ = false;
};

// Column ranges per rank, by value for kernels: rank r owns columns [begin[r], begin[r+1]).
struct ColSplit {
  int world = 1;
  int64_t begin[kMaxTpRanks + 1] = {};
  int64_t count(int r) const { return begin[r + 1] - begin[r]; }
  int64_t max_count() const;
  bool even() const;
};
ColSplit col_split(const std::vector<RowRange>& ranges);

// full is [rows][ld]; on entry this rank holds columns [begin[rank], begin[rank+1]), on return every
// rank holds all of [0, begin[world]). send: rows·max_count floats, recv: world·rows·max_count
// (unused for one row with an even split: then the gather is in place). No-op without a comm.
void gather_cols(TpComm* comm, const ColSplit& sp, float* full, int64_t rows, int64_t ld, float* send, float* recv,
                 cudaStream_t s);

// The MoE exchange. ye [rows][D]: this rank computed the rows whose expert it owns (ids[row] % world
// == rank; its other rows hold garbage). After: every row holds its owner's values. recv:
// world·rows·D floats. ys [n][D] (the shared expert) is broadcast from rank ys_root in the same
// NCCL group; with ids null (experts split by width, ye already whole) only ys moves. No-op without
// a comm.
void gather_expert_rows(TpComm* comm, float* ye, const int32_t* ids, int64_t rows, int64_t D, float* recv, float* ys,
                        int64_t n, int ys_root, cudaStream_t s);

// Runs fn(rank) for every rank concurrently: rank 0 on the calling thread, each other rank on its
// own persistent thread (its CUDA device set). Rethrows the first failure after all ranks returned;
// on a failure `on_error` runs at once (abort the communicators, so no rank waits forever).
class RankPool {
 public:
  RankPool(std::vector<int> devices, std::function<void()> on_error);
  RankPool(const RankPool&) = delete;
  RankPool& operator=(const RankPool&) = delete;
  ~RankPool();
  void run(const std::function<void(int)>& fn);

 private:
  void worker(int rank);
  void run_one(int rank);
  std::vector<int> devices_;
  std::function<void()> on_error_;
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  const std::function<void(int)>* task_ = nullptr;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false, failed_ = false;
  int first_failed_ = -1;  // the rank whose failure started it (the others' errors follow from the abort)
  std::vector<std::exception_ptr> errors_;
  std::vector<std::thread> threads_;
};

}  // namespace dsuf::cuda
