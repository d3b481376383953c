// Built where UCX is absent: both ends refuse to start, and transfers use the TCP path.
#include "cluster/ucx_rma.h"
#include "core/error.h"

namespace dsuf::cluster {

struct UcxExporter::Impl {};
struct UcxImporter::Impl {};

UcxExporter::UcxExporter() {
  fail("UCX is not built into this binary (libucx-dev was absent)");
}
UcxExporter::~UcxExporter() = default;
UcxExporter::Export UcxExporter::expose(const void*, size_t) {
  return {};
}
UcxImporter::UcxImporter() {
  fail("UCX is not built into this binary (libucx-dev was absent)");
}
UcxImporter::~UcxImporter() = default;
std::string UcxImporter::get(const std::string&, std::string&, int, uint64_t) {
  return "UCX is not built";
}

}  // namespace dsuf::cluster
