// State transfer throughput: one replica's TransferServer sends a stored state of S bytes, the
// other pulls it whole (handshake, chunked TCP, XXH3-128 over every byte, prefix check), several
// times; then `ucx_perftest -t ucp_get` (UCX over TCP on loopback, the yardstick) moves
// messages of the same size in the same run.
//   UCX_TLS=tcp,self UCX_NET_DEVICES=lo transfer_bench [--mib 64] [--reps 8]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cluster/transfer.h"

using namespace dsuf::cluster;

namespace {

double ucx_get_mbps(size_t bytes) {
  const int port = 20000 + std::rand() % 20000;
  const std::string env = "UCX_TLS=tcp,self UCX_NET_DEVICES=lo ";
  std::system((env + "ucx_perftest -p " + std::to_string(port) + " >/dev/null 2>&1 &").c_str());
  std::system("sleep 0.5");
  const std::string cmd = env + "ucx_perftest 127.0.0.1 -p " + std::to_string(port) +
                          " -t ucp_get -s " + std::to_string(bytes) + " -n 20 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return -1;
  char line[512];
  double mbps = -1;
  while (fgets(line, sizeof line, p)) {
    double a, b, c, d;
    int n;
    if (std::sscanf(line, "Final: %d %lf %lf %lf %lf", &n, &a, &b, &c, &d) == 5) mbps = d;
  }
  pclose(p);
  return mbps;
}

}  // namespace

int main(int argc, char** argv) {
  size_t mib = 64;
  int reps = 8;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--mib")
      mib = std::strtoul(argv[i + 1], nullptr, 10);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
  }
  const size_t bytes = mib << 20;
  std::vector<int32_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>(i * 31 % 120000);
  std::string blob(bytes, '\0');
  for (size_t i = 0; i < bytes; i += 4096) blob[i] = static_cast<char>(i >> 12);
  auto entry = StoredConversation::make(tokens, std::move(blob));
  TransferIdentity id{.model_id = "bench", .layout_version = 1, .fingerprint = 1, .incarnation = 1};
  TransferServer server(id, {.ucx = true, .fault = ""},
                        [&](std::span<const int32_t>) { return entry; });
  std::unique_ptr<UcxImporter> importer;
  try {
    importer = std::make_unique<UcxImporter>();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "no UCX: %s\n", e.what());
  }
  std::vector<int32_t> prompt = tokens;
  prompt.push_back(1);
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  auto measure = [&](UcxImporter* via, double& best, double& total, std::string& path) {
    best = 1e9;
    total = 0;
    for (int r = 0; r < reps; ++r) {
      FetchResult f = fetch_conversation(addr, id, 1, prompt, 60000, uint64_t{1} << 40, via);
      if (!f.conv) {
        std::fprintf(stderr, "pull failed: %s: %s\n", f.reason.c_str(), f.detail.c_str());
        std::exit(1);
      }
      best = std::min(best, f.seconds);
      total += f.seconds;
      path = f.path;
    }
  };
  double best, total, ubest = 0, utotal = 0;
  std::string path, upath;
  measure(nullptr, best, total, path);
  if (importer && server.ucx()) measure(importer.get(), ubest, utotal, upath);
  if (ubest > 0)
    std::printf("state %zu MiB, %d pulls, our UCX GET path (%s): best %.3f s (%.0f MB/s)\n", mib,
                reps, upath.c_str(), ubest, bytes / ubest / 1e6);
  const double ours = bytes / best / 1e6;
  const double ucx = ucx_get_mbps(bytes);
  std::printf("state %zu MiB, %d pulls, our TCP path (%s): best %.3f s (%.0f MB/s), mean %.3f s\n",
              mib, reps, path.c_str(), best, ours, total / reps);
  std::printf("ucx_perftest ucp_get, %zu MiB messages, UCX_TLS=tcp,self on lo: %.0f MB/s\n", mib,
              ucx);
  std::printf("ratio (ours / ucx tcp get): %.2f\n", ucx > 0 ? ours / ucx : 0.0);
  return 0;
}
