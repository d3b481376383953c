// Prometheus text exposition (format 0.0.4) with the vLLM metric names (spec ecosystem.md §4), so
// existing dashboards and gateway pickers read us unchanged. Intervals use a monotonic clock and
// are measured by the server from request arrival (TTFT includes tokenization, as vLLM's does).
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace dsuf::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void observe(double v);
  void render(std::string& out, const std::string& name, const std::string& labels) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t n_ = 0;
};

class Metrics {
 public:
  explicit Metrics(std::string model_name);

  Histogram ttft, itl, e2e, prompt_len, generation_len;
  void finished(const std::string& reason);  // stop | length | tool_calls | abort | error
  void http(int status);
  std::atomic<uint64_t> disconnects{0};

  std::string render(const EngineStats& engine) const;
  // More exposition text appended to render()'s (the conversation cache's).
  void set_extra(std::function<std::string()> f) {
    std::lock_guard lk(mu_);
    extra_ = std::move(f);
  }

 private:
  std::string labels_;
  mutable std::mutex mu_;
  std::map<std::string, uint64_t> finished_;
  std::map<int, uint64_t> http_;
  std::function<std::string()> extra_;  // guarded by mu_
};

}  // namespace dsuf::server
