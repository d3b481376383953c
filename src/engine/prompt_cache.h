// The seam between the server and a conversation cache (src/cluster implements it). The server
// asks for a reusable prefix before submitting and hands the states back through
// Request::on_state; it never learns where a state came from beyond the tier name.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/kv_layout.h"

namespace dsuf {

struct CachedPrefix {
  std::shared_ptr<const SequenceState> state;  // null: nothing reusable
  int64_t tokens = 0;                          // prompt[0, tokens) is in the state
  std::string tier = "recompute";              // local | remote | recompute
};

class PromptCache {
 public:
  virtual ~PromptCache() = default;
  // May block (a remote fetch); call it off the I/O thread. Never throws: a failure is a miss.
  virtual CachedPrefix lookup(const std::string& session, std::span<const int32_t> prompt) = 0;
  // Takes a state that has consumed `tokens`; cheap on the caller's thread (the scheduler's).
  virtual void store(const std::string& session, std::vector<int32_t> tokens,
                     SequenceState state) = 0;
  // Prometheus text for /metrics.
  virtual std::string metrics_text() const = 0;
};

}  // namespace dsuf
