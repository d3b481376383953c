// serve: the OpenAI-compatible server.
//   serve [--ckpt DIR] [--demo] [--cpu | --gpus LIST] [--host H] [--port P] [--max-batch N]
//         [--max-context N] ... (serve --help lists everything)
// The port opens at once; /readyz answers 503 until the weights are loaded and a warm-up step ran.
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "backend/factory.h"
#include "core/error.h"
#include "engine/engine.h"
#include "model/tiny.h"
#include "model/weights.h"
#include "server/http_server.h"
#include "text/engram_ids.h"
#include "text/tokenizer.h"
#ifdef DSUF_HAVE_CLUSTER
#include "cluster/conversation_cache.h"
#endif

namespace {

namespace fs = std::filesystem;
using dsuf::fail;

struct Args {
  std::string ckpt = "models";
  bool ckpt_given = false;
  bool demo = false;
  bool cpu = false;
  std::string gpus;
  dsuf::server::ServerOptions server;
  dsuf::EngineOptions engine;
  std::string model_name = "deepseek-v4-flash";
  int threads = 0;
  double host_cache_gb = 4;  // 0: no conversation cache
  std::string replica_id, transfer_host = "127.0.0.1", advertise_host;
  int transfer_port = 0, max_outbound = 4;
  bool ucx = true;
};

const char* kUsage =
    "usage: serve [--ckpt DIR] [--demo] [--cpu | --gpus LIST] [--host ADDR] [--port N]\n"
    "             [--max-batch N] [--max-context N] [--max-waiting N] [--prefill-chunk N]\n"
    "             [--max-step-tokens N] [--served-model-name NAME] [--threads N]\n"
    "             [--max-body-bytes N] [--request-timeout S] [--drain-timeout S] [--keepalive S]\n"
    "\n"
    "  --ckpt DIR         checkpoint folder (default: models)\n"
    "  --demo             no checkpoint needed: create the tiny demo checkpoint (random weights) "
    "once\n"
    "                     at --ckpt DIR when given, else next to the binary (build/demo-ckpt), "
    "and\n"
    "                     serve it on the CPU\n"
    "  --cpu              the CPU reference backend (the default)\n"
    "  --gpus LIST        the CUDA backend on these GPUs (e.g. 0, or 0,1,2,3: tensor parallel)\n"
    "  --host ADDR        listen address (default 0.0.0.0); --port N (default 8000; 0: any free "
    "port)\n"
    "  --max-batch N      sequences decoded together (default 64)\n"
    "  --max-context N    prompt + generated tokens per request (default: the model's, at most "
    "65536)\n"
    "  --max-waiting N    queued requests before 429 (default 1024)\n"
    "  --host-cache-gb G  host RAM for finished conversations' states, LRU (default 4; 0: off)\n"
    "  --replica-id ID    this replica's name in Redis (default: hostname-pid)\n"
    "  --transfer-host A  address the state-transfer server binds (default 127.0.0.1)\n"
    "  --transfer-port N  its port (default 0: any free port)\n"
    "  --advertise-host A the address peers dial for transfers (default: --transfer-host)\n"
    "  --max-outbound-transfers N  states sent at once before peers are told to recompute "
    "(default 4)\n"
    "  --kv-transport T   auto (UCX RMA GET when built and it starts, else TCP) or tcp "
    "(default auto)\n"
    "Environment: DSUF_REDIS_URL=redis://host:port shares conversation ownership across "
    "replicas\n"
    "(unset: each replica caches only its own conversations).\n";

long long int_arg(const std::string& k, const std::string& v, long long lo, long long hi) {
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end || errno || x < lo || x > hi)
    fail(k, ": expected an integer in [", lo, ", ", hi, "], got '", v, "'");
  return x;
}

double secs_arg(const std::string& k, const std::string& v) {
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end || !(x > 0) || x > 1e6)
    fail(k, ": expected a positive number of seconds, got '", v, "'");
  return x;
}

Args parse(int argc, char** argv) {
  Args a;
  a.engine.max_context = 0;  // 0: the model's context, capped at 65536
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(k, " needs a value");
      return argv[++i];
    };
    if (k == "--ckpt")
      a.ckpt = value(), a.ckpt_given = true;
    else if (k == "--demo")
      a.demo = true;
    else if (k == "--cpu")
      a.cpu = true;
    else if (k == "--gpus")
      a.gpus = value();
    else if (k == "--host")
      a.server.host = value();
    else if (k == "--port")
      a.server.port = static_cast<uint16_t>(int_arg(k, value(), 0, 65535));
    else if (k == "--max-batch")
      a.engine.max_batch = static_cast<int>(int_arg(k, value(), 1, 1 << 20));
    else if (k == "--max-context")
      a.engine.max_context = int_arg(k, value(), 2, int64_t{1} << 40);
    else if (k == "--max-waiting")
      a.engine.max_waiting = static_cast<size_t>(int_arg(k, value(), 0, 1 << 30));
    else if (k == "--prefill-chunk")
      a.engine.prefill_chunk = static_cast<int>(int_arg(k, value(), 1, 1 << 24));
    else if (k == "--max-step-tokens")
      a.engine.max_step_tokens = static_cast<int>(int_arg(k, value(), 1, 1 << 24));
    else if (k == "--served-model-name")
      a.model_name = value();
    else if (k == "--threads")
      a.threads = static_cast<int>(int_arg(k, value(), 0, 4096));
    else if (k == "--max-body-bytes")
      a.server.max_body_bytes = static_cast<size_t>(int_arg(k, value(), 1024, int64_t{1} << 40));
    else if (k == "--request-timeout")
      a.server.request_timeout_s = secs_arg(k, value());
    else if (k == "--drain-timeout")
      a.server.drain_timeout_s = secs_arg(k, value());
    else if (k == "--keepalive")
      a.server.keepalive_s = secs_arg(k, value());
    else if (k == "--host-cache-gb") {
      const std::string v = value();
      char* end = nullptr;
      a.host_cache_gb = std::strtod(v.c_str(), &end);
      if (v.empty() || *end || !(a.host_cache_gb >= 0) || a.host_cache_gb > 1e5)
        fail("--host-cache-gb: expected a number of GiB >= 0, got '", v, "'");
    } else if (k == "--replica-id")
      a.replica_id = value();
    else if (k == "--transfer-host")
      a.transfer_host = value();
    else if (k == "--transfer-port")
      a.transfer_port = static_cast<int>(int_arg(k, value(), 0, 65535));
    else if (k == "--advertise-host")
      a.advertise_host = value();
    else if (k == "--kv-transport") {
      const std::string v = value();
      if (v != "auto" && v != "tcp") fail("--kv-transport: expected auto or tcp, got '", v, "'");
      a.ucx = v == "auto";
    } else if (k == "--max-outbound-transfers")
      a.max_outbound = static_cast<int>(int_arg(k, value(), 0, 4096));
    else if (k == "--help" || k == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    } else
      fail("unknown argument ", k, " (see serve --help)");
  }
  if (!a.gpus.empty() && a.cpu) fail("give --cpu or --gpus, not both");
  if (!a.gpus.empty()) {
    dsuf::parse_gpu_list(a.gpus);  // a bad list fails before anything loads
    if (!dsuf::cuda_backend_built())
      fail("--gpus ", a.gpus, ": this build has no CUDA backend (nvcc was not found); use --cpu");
  }
  if (a.model_name.empty()) fail("--served-model-name must not be empty");
  return a;
}

// The demo checkpoint lives next to the build (build/demo-ckpt, what `make run` uses), or in the
// user's cache folder when the binary's folder is not writable. Written to a temporary folder and
// renamed, so an interrupted first run never leaves a half checkpoint behind.
std::string demo_checkpoint(const std::string& given) {
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  std::vector<fs::path> places;
  if (!given.empty())
    places.push_back(given);
  else if (!ec)
    places.push_back(exe.parent_path().parent_path() / "demo-ckpt");
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  if (xdg && *xdg)
    places.push_back(fs::path(xdg) / "dsuf" / "demo-ckpt");
  else if (home && *home)
    places.push_back(fs::path(home) / ".cache" / "dsuf" / "demo-ckpt");
  for (const auto& p : places)
    if (fs::exists(p / "config.json")) return p.string();
  for (const auto& p : places) {
    fs::create_directories(p.parent_path(), ec);
    if (ec || access(p.parent_path().c_str(), W_OK) != 0) continue;
    const fs::path tmp = p.string() + ".tmp-" + std::to_string(getpid());
    std::fprintf(stderr, "serve: writing the tiny demo checkpoint (random weights) to %s\n",
                 p.c_str());
    dsuf::write_tiny_checkpoint(
        {.out_dir = tmp.string(),
         .seed = 1,
         .num_shards = 4,
         .tokenizer_dir = std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer"});
    fs::rename(tmp, p, ec);
    if (ec) {  // another process won the race
      fs::remove_all(tmp, ec);
    }
    return p.string();
  }
  fail(
      "--demo: no writable place for the demo checkpoint (tried next to the binary and "
      "~/.cache/dsuf)");
}

// Everything the chat service needs, loaded off the I/O thread.
struct Loaded {
  std::unique_ptr<dsuf::LoadedModel> model;
  std::unique_ptr<dsuf::text::Tokenizer> tokenizer;
  std::unique_ptr<dsuf::Backend> backend;
  std::unique_ptr<dsuf::Engine> engine;
  std::shared_ptr<dsuf::server::ChatService> service;
  std::shared_ptr<dsuf::PromptCache> cache;
};

void attach_cache(const Args& a, const dsuf::Backend& backend, Loaded& out);

void load(const Args& a, const std::string& ckpt, Loaded& out) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!fs::exists(fs::path(ckpt) / "config.json"))
    fail("no checkpoint at ", ckpt, " (", ckpt,
         "/config.json is missing); pass --ckpt DIR, or --demo for the tiny model");
  out.model = dsuf::load_model(ckpt);
  const fs::path tok_path = fs::path(ckpt) / "tokenizer.json";
  if (!fs::exists(tok_path))
    fail(tok_path.string(), " is missing: the checkpoint must ship its tokenizer");
  out.tokenizer = std::make_unique<dsuf::text::Tokenizer>(tok_path);
  dsuf::EngineOptions eo = a.engine;
  const int64_t model_ctx = out.model->config.text.max_position_embeddings;
  if (eo.max_context == 0) {
    eo.max_context = model_ctx > 0 ? std::min<int64_t>(model_ctx, 65536) : 8192;
  } else if (model_ctx > 0 && eo.max_context > model_ctx) {
    std::fprintf(stderr, "serve: --max-context %lld exceeds the model's %lld; using %lld\n",
                 static_cast<long long>(eo.max_context), static_cast<long long>(model_ctx),
                 static_cast<long long>(model_ctx));
    eo.max_context = model_ctx;
  }
  // The GPU backend sizes its memory plan from the same batch and context the engine admits.
  dsuf::BackendOptions bo{
      .cpu = a.gpus.empty(),
      .gpus = a.gpus.empty() ? std::vector<int>{} : dsuf::parse_gpu_list(a.gpus),
      .max_batch = eo.max_batch,
      .max_context = eo.max_context,
      .numerics = {},
      .cpu_threads = a.threads};
  out.backend =
      dsuf::make_backend(*out.model, dsuf::text::engram_compressed_ids(*out.tokenizer), bo);
  out.engine = std::make_unique<dsuf::Engine>(*out.backend, eo);
  while (!out.engine->ready()) {
    const auto st = out.engine->stats();
    if (!st.warm_up_error.empty()) fail("warm-up failed: ", st.warm_up_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  dsuf::server::ModelInfo info{.id = a.model_name,
                               .created = static_cast<int64_t>(std::time(nullptr)),
                               .max_context = eo.max_context};
  out.service = std::make_shared<dsuf::server::ChatService>(*out.engine, *out.tokenizer, info);
  attach_cache(a, *out.backend, out);
  std::fprintf(
      stderr,
      "serve: ready: %s on the %s backend, max batch %d, context %lld, state budget %.1f MiB, "
      "loaded in %.2f s\n",
      ckpt.c_str(), a.gpus.empty() ? "CPU" : "CUDA", eo.max_batch,
      static_cast<long long>(eo.max_context), out.engine->stats().state_budget_bytes / 1048576.0,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The conversation cache works the same on both backends: the engine downloads a state before it
// hands it to the cache (Backend::download), and the CUDA backend uploads a cached state's host
// pools into fresh device pools when it resumes one.
void attach_cache(const Args& a, const dsuf::Backend& backend, Loaded& out) {
  const char* redis = std::getenv("DSUF_REDIS_URL");
  if (a.host_cache_gb <= 0) return;
#ifdef DSUF_HAVE_CLUSTER
  const char* fault = std::getenv("DSUF_TRANSFER_FAULT");
  dsuf::cluster::CacheOptions co;
  co.capacity_bytes = static_cast<size_t>(a.host_cache_gb * 1073741824.0);
  co.model_id = a.model_name;
  co.redis_url = redis ? redis : "";
  co.replica_id = a.replica_id;
  co.transfer_host = a.transfer_host;
  co.transfer_port = static_cast<uint16_t>(a.transfer_port);
  co.advertise_host = a.advertise_host;
  co.max_outbound = a.max_outbound;
  co.ucx = a.ucx;
  co.fault = fault ? fault : "";
  auto cache = std::make_shared<dsuf::cluster::ConversationCache>(backend.layout(), co);
  std::fprintf(stderr, "serve: conversation cache %.2f GiB, transfers on %s:%u, redis %s\n",
               a.host_cache_gb, a.transfer_host.c_str(), cache->transfer_port(),
               co.redis_url.empty() ? "off (local only)" : co.redis_url.c_str());
  out.cache = cache;
  out.service->set_cache(cache);
#else
  (void)backend;
  (void)out;
  if (redis && *redis)
    std::fprintf(stderr, "serve: DSUF_REDIS_URL is set but this build has no src/cluster\n");
#endif
}

int serve_main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  std::string ckpt = a.ckpt;
  if (a.demo) ckpt = demo_checkpoint(a.ckpt_given ? a.ckpt : "");
  dsuf::server::Metrics metrics(a.model_name);
  dsuf::server::HttpServer server(a.server, metrics);
  const uint16_t port = server.listen();
  std::fprintf(stderr, "serve: listening on http://%s:%u (loading %s)\n", a.server.host.c_str(),
               port, ckpt.c_str());
  std::fflush(stderr);

  // Declared after the server, so it is destroyed first: the engine's last events are posted to
  // the stopped (still existing) I/O context.
  Loaded loaded;
  std::thread loader([&] {
    try {
      load(a, ckpt, loaded);
      if (loaded.cache)
        metrics.set_extra([c = std::weak_ptr(loaded.cache)] {
          auto p = c.lock();
          return p ? p->metrics_text() : std::string();
        });
      server.set_service(loaded.service);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "serve: error: %s\n", e.what());
      server.set_load_error(e.what());
      server.stop();
    }
  });
  server.run();
  loader.join();
  const bool failed = loaded.service == nullptr;
  loaded.service.reset();
  loaded.engine.reset();  // its last states reach the cache first
  loaded.cache.reset();
  std::fprintf(stderr, "serve: stopped\n");
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return serve_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "serve: error: %s\n", e.what());
    return 1;
  }
}
