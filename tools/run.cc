// run: offline generation with a checkpoint.
//   run --ckpt DIR --cpu (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N
//       [--temperature T --top-p P --top-k K --seed S] [--dump-logits FILE] [--print-ids]
//       [--numerics reference|transformers] [--ignore-eos] [--threads N]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "backend/factory.h"
#include "core/error.h"
#include "core/parse.h"
#include "core/sampling.h"
#include "model/weights.h"
#ifdef DSUF_HAVE_TEXT
#include "text/engram_ids.h"
#include "text/tokenizer.h"
#endif

namespace {

using dsuf::fail;

struct Args {
  std::string ckpt = "models";
  bool cpu = false;
  std::string gpus;
  std::string prompt;
  bool have_prompt = false;
  std::vector<int32_t> prompt_ids;
  int max_tokens = 64;
  dsuf::SamplingParams sampling;
  std::string dump_logits;
  bool print_ids = false;
  bool ignore_eos = false;
  std::string numerics = "reference";
  int threads = 0;
  int64_t max_context = 0;  // 0: prompt + max_tokens
};

std::vector<int32_t> parse_ids(const std::string& s) {
  std::vector<int32_t> ids;
  for (int64_t v : dsuf::parse_int_list(s, "--prompt-ids", 0, INT32_MAX)) ids.push_back(int32_t(v));
  return ids;
}

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) fail(k, " needs a value");
      return argv[++i];
    };
    if (k == "--ckpt") a.ckpt = value();
    else if (k == "--cpu") a.cpu = true;
    else if (k == "--gpus") a.gpus = value();
    else if (k == "--prompt") a.prompt = value(), a.have_prompt = true;
    else if (k == "--prompt-ids") a.prompt_ids = parse_ids(value());
    else if (k == "--max-tokens") a.max_tokens = std::stoi(value());
    else if (k == "--temperature") a.sampling.temperature = std::stof(value());
    else if (k == "--top-p") a.sampling.top_p = std::stof(value());
    else if (k == "--top-k") a.sampling.top_k = std::stoi(value());
    else if (k == "--seed") a.sampling.seed = std::stoull(value());
    else if (k == "--dump-logits") a.dump_logits = value();
    else if (k == "--print-ids") a.print_ids = true;
    else if (k == "--ignore-eos") a.ignore_eos = true;
    else if (k == "--numerics") a.numerics = value();
    else if (k == "--threads") a.threads = std::stoi(value());
    else if (k == "--max-context") a.max_context = std::stoll(value());
    else if (k == "--help" || k == "-h") {
      std::printf(
          "usage: run --ckpt DIR (--cpu | --gpus 0[,1,...]) (--prompt TEXT | --prompt-ids 1,2,3) --max-tokens N\n"
          "           [--temperature T] [--top-p P] [--top-k K] [--seed S] [--dump-logits FILE]\n"
          "           [--print-ids] [--ignore-eos] [--numerics reference|transformers] [--threads N]\n"
          "Greedy when the temperature is 0 (the default).\n");
      std::exit(0);
    } else
      fail("unknown argument ", k, " (see run --help)");
  }
  if (a.have_prompt == !a.prompt_ids.empty()) fail("give exactly one of --prompt and --prompt-ids");
  if (a.cpu && !a.gpus.empty()) fail("give one of --cpu and --gpus");
  if (!a.cpu && a.gpus.empty()) a.cpu = true;
  if (a.max_tokens < 0) fail("--max-tokens must be >= 0");
  if (a.sampling.temperature < 0) fail("--temperature must be >= 0");
  if (!(a.sampling.top_p > 0 && a.sampling.top_p <= 1)) fail("--top-p must be in (0, 1]");
  if (a.numerics != "reference" && a.numerics != "transformers")
    fail("--numerics must be reference or transformers");
  return a;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run_main(int argc, char** argv) {
  Args a = parse(argc, argv);
  auto t_load = std::chrono::steady_clock::now();
  auto model = dsuf::load_model(a.ckpt);
  for (size_t i = 0; i < model->unknown_tensors.size() && i < 3; ++i)
    std::fprintf(stderr, "warning: tensor %s is not used by this engine\n", model->unknown_tensors[i].c_str());

  std::vector<int32_t> compressed;
#ifdef DSUF_HAVE_TEXT
  dsuf::text::Tokenizer tok(a.ckpt + "/tokenizer.json");
  compressed = dsuf::text::engram_compressed_ids(tok);
  if (a.have_prompt) a.prompt_ids = tok.encode(a.prompt, /*match_added_tokens=*/true);
#else
  if (a.have_prompt) fail("--prompt needs the text library (built without it); use --prompt-ids");
  compressed = dsuf::read_compressed_id_table(std::string(DSUF_SOURCE_DIR) + "/assets/tokenizer/engram-compressed-ids.txt");
#endif
  dsuf::BackendOptions bo;
  bo.cpu = a.cpu;
  if (!a.cpu) bo.gpus = dsuf::parse_gpu_list(a.gpus);
  bo.max_batch = 1;
  bo.max_context = a.max_context > 0 ? a.max_context : int64_t(a.prompt_ids.size()) + a.max_tokens + 1;
  bo.numerics = a.numerics == "transformers" ? dsuf::transformers_numerics() : dsuf::CpuNumerics{};
  bo.cpu_threads = a.threads;
  std::unique_ptr<dsuf::Backend> backend_ptr = dsuf::make_backend(*model, std::move(compressed), bo);
  dsuf::Backend& backend = *backend_ptr;
  const double load_s = seconds_since(t_load);

  dsuf::SequenceState st = backend.new_sequence();
  std::vector<float> logits;
  std::ofstream dump;
  if (!a.dump_logits.empty()) {
    dump.open(a.dump_logits, std::ios::binary);
    if (!dump) fail(a.dump_logits, ": cannot write");
  }
  std::vector<int32_t> out;
  // The backend samples (on the GPU with --gpus); logits come back only for --dump-logits.
  const bool dumping = !a.dump_logits.empty();
  std::vector<float>* want_logits = dumping ? &logits : nullptr;

  auto t0 = std::chrono::steady_clock::now();
  int32_t next = 0;
  dsuf::ForwardItem item{.state = &st, .tokens = a.prompt_ids, .want = dsuf::ForwardItem::Logits::kLast,
                         .logits = want_logits, .sampling = a.sampling, .draw = 0, .token = &next};
  backend.forward({&item, 1});
  const double prefill_s = seconds_since(t0);
  auto t1 = std::chrono::steady_clock::now();
  for (int step = 0; step < a.max_tokens; ++step) {
    if (step > 0) {
      const int32_t fed = next;
      dsuf::ForwardItem d{.state = &st, .tokens = {&fed, 1}, .want = dsuf::ForwardItem::Logits::kLast,
                          .logits = want_logits, .sampling = a.sampling, .draw = uint64_t(step), .token = &next};
      backend.forward({&d, 1});
    }
    if (dumping) dump.write(reinterpret_cast<const char*>(logits.data()), logits.size() * sizeof(float));
    out.push_back(next);
    if (!a.ignore_eos && next == model->config.eos_token_id) break;
  }
  const double decode_s = seconds_since(t1);

#ifdef DSUF_HAVE_TEXT
  std::printf("%s\n", tok.decode(out, /*skip_special=*/false).c_str());
#endif
  if (a.print_ids) {
    for (size_t i = 0; i < out.size(); ++i) std::printf("%s%d", i ? "," : "", out[i]);
    std::printf("\n");
  }
  const int decode_steps = static_cast<int>(out.size()) - 1;  // the first token comes from prefill
  std::fprintf(stderr,
               "stats: load %.2f s | prefill %zu tokens %.3f s (%.1f tok/s) | decode %d tokens %.3f s (%.1f tok/s) | "
               "backend %s (%s numerics)\n",
               load_s, a.prompt_ids.size(), prefill_s, a.prompt_ids.size() / std::max(prefill_s, 1e-9),
               std::max(decode_steps, 0), decode_s, std::max(decode_steps, 0) / std::max(decode_s, 1e-9),
               a.cpu ? "cpu" : ("cuda:" + a.gpus).c_str(), a.numerics.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run_main(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "run: error: %s\n", e.what());
    return 1;
  }
}
