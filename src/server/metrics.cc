#include "server/metrics.h"

#include <cstdio>

namespace dsuf::server {
namespace {

std::string num(double v) {
  char b[64];
  std::snprintf(b, sizeof b, "%.17g", v);
  return b;
}

void head(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  std::lock_guard lk(mu_);
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++n_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& labels) const {
  std::lock_guard lk(mu_);
  uint64_t cum = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    out += name + "_bucket{" + labels + ",le=\"" + le + "\"} " + std::to_string(cum) + "\n";
  }
  out += name + "_sum{" + labels + "} " + num(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(n_) + "\n";
}

Metrics::Metrics(std::string model_name)
    : ttft({0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
            1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}),
      itl({0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
           20.0, 40.0, 80.0}),
      e2e({0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
           30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}),
      prompt_len({1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000,
                  200000, 500000, 1000000}),
      generation_len(
          {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}),
      labels_("model_name=\"" + model_name + "\"") {}

void Metrics::finished(const std::string& reason) {
  std::lock_guard lk(mu_);
  ++finished_[reason];
}

void Metrics::http(int status) {
  std::lock_guard lk(mu_);
  ++http_[status];
}

std::string Metrics::render(const EngineStats& s) const {
  std::string o;
  head(o, "vllm:num_requests_running", "gauge",
       "Requests admitted to the batch (prefilling or decoding).");
  o += "vllm:num_requests_running{" + labels_ + "} " + std::to_string(s.running) + "\n";
  head(o, "vllm:num_requests_waiting", "gauge", "Requests queued for admission.");
  o += "vllm:num_requests_waiting{" + labels_ + "} " + std::to_string(s.waiting) + "\n";
  head(o, "vllm:kv_cache_usage_perc", "gauge",
       "Fraction of the sequence-state budget reserved (0-1).");
  const double use =
      s.state_budget_bytes ? double(s.state_reserved_bytes) / double(s.state_budget_bytes) : 0;
  o += "vllm:kv_cache_usage_perc{" + labels_ + "} " + num(use) + "\n";
  head(o, "vllm:prompt_tokens_total", "counter", "Prompt tokens prefilled.");
  o += "vllm:prompt_tokens_total{" + labels_ + "} " + std::to_string(s.prompt_tokens_total) + "\n";
  head(o, "vllm:generation_tokens_total", "counter", "Tokens generated.");
  o += "vllm:generation_tokens_total{" + labels_ + "} " +
       std::to_string(s.generation_tokens_total) + "\n";
  head(o, "vllm:time_to_first_token_seconds", "histogram",
       "Time from request arrival to the first token.");
  ttft.render(o, "vllm:time_to_first_token_seconds", labels_);
  head(o, "vllm:inter_token_latency_seconds", "histogram",
       "Time between consecutive generated tokens.");
  itl.render(o, "vllm:inter_token_latency_seconds", labels_);
  head(o, "vllm:e2e_request_latency_seconds", "histogram", "Time from arrival to the last token.");
  e2e.render(o, "vllm:e2e_request_latency_seconds", labels_);
  head(o, "vllm:request_prompt_tokens", "histogram", "Prompt tokens per request.");
  prompt_len.render(o, "vllm:request_prompt_tokens", labels_);
  head(o, "vllm:request_generation_tokens", "histogram", "Generated tokens per request.");
  generation_len.render(o, "vllm:request_generation_tokens", labels_);
  std::lock_guard lk(mu_);
  head(o, "vllm:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [r, n] : finished_)
    o += "vllm:request_success_total{" + labels_ + ",finished_reason=\"" + r + "\"} " +
         std::to_string(n) + "\n";
  head(o, "dsuf:http_responses_total", "counter", "HTTP responses by status.");
  for (const auto& [st, n] : http_)
    o += "dsuf:http_responses_total{status=\"" + std::to_string(st) + "\"} " + std::to_string(n) +
         "\n";
  head(o, "dsuf:client_disconnects_total", "counter",
       "Requests cancelled because the client went away.");
  o += "dsuf:client_disconnects_total " + std::to_string(disconnects.load()) + "\n";
  head(o, "dsuf:engine_steps_total", "counter", "Scheduler steps run.");
  o += "dsuf:engine_steps_total " + std::to_string(s.steps) + "\n";
  head(o, "dsuf:engine_forward_seconds_total", "counter",
       "Wall time spent in the backend's forward.");
  o += "dsuf:engine_forward_seconds_total " + num(s.forward_seconds) + "\n";
  head(o, "dsuf:engine_forward_cpu_seconds_total", "counter",
       "CPU time of the scheduler thread inside the backend's forward (all of it with --threads "
       "1).");
  o += "dsuf:engine_forward_cpu_seconds_total " + num(s.forward_cpu_seconds) + "\n";
  if (extra_) o += extra_();  // mu_ is held from above
  return o;
}

}  // namespace dsuf::server
