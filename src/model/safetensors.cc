#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace dsuf {

// The data section is used in place, so multi-byte elements must already be in host order.
static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The reference reader's limit (safetensors MAX_HEADER_SIZE): a larger length is corruption, not a
// header, and refusing it early avoids handing a multi-gigabyte range to the JSON parser.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DTypeEntry {
  DType dtype;
  const char* name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::BF16, "BF16", 2},       {DType::F16, "F16", 2},         {DType::F32, "F32", 4},
    {DType::F64, "F64", 8},         {DType::I8, "I8", 1},           {DType::U8, "U8", 1},
    {DType::I16, "I16", 2},         {DType::I32, "I32", 4},         {DType::I64, "I64", 8},
    {DType::U16, "U16", 2},         {DType::U32, "U32", 4},         {DType::U64, "U64", 8},
    {DType::BOOL, "BOOL", 1},       {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
    {DType::F8_E8M0, "F8_E8M0", 1},
};
static_assert(std::size(kDTypes) == std::size(kAllDTypes));

// Valid safetensors dtypes that we do not read, so the error can say "unsupported" rather than
// "unknown": a checkpoint with one of these is well-formed but needs engine work.
constexpr const char* kKnownUnsupported[] = {"F4",          "F6_E2M3",     "F6_E3M2",
                                             "F8_E4M3FNUZ", "F8_E5M2FNUZ", "C64"};

const DTypeEntry& entry(DType dtype) {
  for (const auto& e : kDTypes)
    if (e.dtype == dtype) return e;
  fail("invalid DType value ", static_cast<int>(dtype));
}

// Product of the dims times the element size, or nullopt on overflow of either int64 or size_t.
std::optional<std::pair<int64_t, size_t>> checked_sizes(const std::vector<int64_t>& shape,
                                                        size_t elem_size) {
  int64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(numel, d, &numel)) return std::nullopt;
  }
  size_t nbytes;
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), elem_size, &nbytes)) return std::nullopt;
  return std::pair{numel, nbytes};
}

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// A JSON value printed for an error message, cut short so a hostile header cannot flood the log.
std::string brief(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 80) s = s.substr(0, 77) + "...";
  return s;
}

uint64_t json_u64(const json& j) {
  return j.is_number_unsigned() ? j.get<uint64_t>() : static_cast<uint64_t>(j.get<int64_t>());
}
bool json_nonneg_int(const json& j) {
  return j.is_number_unsigned() || (j.is_number_integer() && j.get<int64_t>() >= 0);
}

// Parses JSON from [begin, end), refusing duplicate keys in the top-level object: nlohmann keeps
// the last one silently, and two entries for one tensor name mean the file is not what it claims.
json parse_json(const char* begin, const char* end, const std::string& what) {
  std::string duplicate;
  std::set<std::string, std::less<>> keys;
  auto on_event = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth == 1 && event == json::parse_event_t::key && duplicate.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!keys.insert(k).second) duplicate = k;
    }
    return true;
  };
  json j;
  try {
    j = json::parse(begin, end, on_event);
  } catch (const json::exception& e) {
    fail(what, ": not valid JSON: ", e.what());
  }
  if (!duplicate.empty()) fail(what, ": key '", duplicate, "' appears more than once");
  return j;
}

// Owns an open file descriptor for the duration of open().
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

size_t dtype_size(DType dtype) {
  return entry(dtype).size;
}
const char* dtype_name(DType dtype) {
  return entry(dtype).name;
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (const auto& e : kDTypes)
    if (name == e.name) return e.dtype;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;  // validated against overflow when the header was read
  return n;
}

// ---- SafetensorsFile ---------------------------------------------------------------------------

std::unique_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  const std::string where = "safetensors file '" + path + "'";
  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  if (fd.fd < 0) fail(where, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd.fd, &st) != 0) fail(where, ": cannot stat: ", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail(where, ": not a regular file");
  const auto size = static_cast<uint64_t>(st.st_size);
  if (size < 8)
    fail(where, ": file is ", size, " bytes, too short for the 8-byte header length (truncated?)");

  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  // MAP_PRIVATE so a writer elsewhere cannot change what we validated through our mapping (it can
  // still shrink the file, which would fault on access: nothing a reader can prevent).
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  if (p == MAP_FAILED) fail(where, ": mmap of ", size, " bytes failed: ", std::strerror(errno));
  f->base_ = static_cast<const uint8_t*>(p);
  f->size_ = size;
  // Weights are read once, front to back, when they are copied to the device: ask for aggressive
  // readahead. Not MADV_WILLNEED on the whole file: for a 3 GB shard that blocks on reading it all.
  // The advice is only a hint, so its failure is ignored.
  (void)::madvise(p, size, MADV_SEQUENTIAL);

  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f->base_[i];
  if (header_len > size - 8)
    fail(where, ": header length ", header_len, " exceeds the ", size - 8,
         " bytes after the length field (truncated or not a safetensors file)");
  if (header_len > kMaxHeaderBytes)
    fail(where, ": header length ", header_len, " is larger than the ", kMaxHeaderBytes,
         "-byte limit of the reference implementation");
  f->data_offset_ = 8 + header_len;
  const size_t data_size = size - f->data_offset_;

  const char* hbegin = reinterpret_cast<const char*>(f->base_ + 8);
  // nlohmann's lexer takes a NUL byte for the end of input and would ignore what follows it.
  if (const void* nul = std::memchr(hbegin, 0, header_len))
    fail(where, ": header is not valid JSON: NUL byte at header offset ",
         static_cast<const char*>(nul) - hbegin);
  json header = parse_json(hbegin, hbegin + header_len, where + " header");
  if (!header.is_object())
    fail(where, ": header is a JSON ", header.type_name(), ", not an object");

  struct Range {
    size_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (auto& [name, value] : header.items()) {
    if (name == "__metadata__") {
      if (!value.is_object())
        fail(where, ": __metadata__ is ", brief(value), ", expected an object of strings");
      for (auto& [k, v] : value.items()) {
        if (!v.is_string())
          fail(where, ": __metadata__['", k, "'] is ", brief(v), ", expected a string");
        f->metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    const std::string tw = where + ": tensor '" + name + "'";
    if (!value.is_object()) fail(tw, ": entry is ", brief(value), ", expected an object");
    // Keys other than these three are ignored, as the reference reader does.
    auto dt = value.find("dtype");
    auto sh = value.find("shape");
    auto of = value.find("data_offsets");
    if (dt == value.end() || sh == value.end() || of == value.end())
      fail(tw, ": entry ", brief(value), " lacks ",
           dt == value.end()   ? "dtype"
           : sh == value.end() ? "shape"
                               : "data_offsets");
    if (!dt->is_string()) fail(tw, ": dtype is ", brief(*dt), ", expected a string");
    const auto& dts = dt->get_ref<const std::string&>();
    auto dtype = parse_dtype(dts);
    if (!dtype) {
      bool known =
          std::find_if(std::begin(kKnownUnsupported), std::end(kKnownUnsupported),
                       [&](const char* n) { return dts == n; }) != std::end(kKnownUnsupported);
      fail(tw, ": ", known ? "unsupported" : "unknown", " dtype '", dts, "'");
    }
    if (!sh->is_array()) fail(tw, ": shape is ", brief(*sh), ", expected an array of integers");
    std::vector<int64_t> shape;
    for (const auto& d : *sh) {
      if (!json_nonneg_int(d) || json_u64(d) > static_cast<uint64_t>(INT64_MAX))
        fail(tw, ": shape ", brief(*sh), " has a dim that is not a non-negative integer");
      shape.push_back(static_cast<int64_t>(json_u64(d)));
    }
    if (!of->is_array() || of->size() != 2 || !json_nonneg_int((*of)[0]) ||
        !json_nonneg_int((*of)[1]))
      fail(tw, ": data_offsets is ", brief(*of),
           ", expected [begin, end] of non-negative integers");
    const uint64_t begin = json_u64((*of)[0]), end = json_u64((*of)[1]);
    if (begin > end) fail(tw, ": data_offsets [", begin, ", ", end, "] has begin > end");
    auto sizes = checked_sizes(shape, dtype_size(*dtype));
    if (!sizes) fail(tw, ": shape ", shape_str(shape), " overflows 64-bit element or byte counts");
    if (end - begin != sizes->second)
      fail(tw, ": shape ", shape_str(shape), " ", dts, " needs ", sizes->second,
           " bytes but data_offsets [", begin, ", ", end, "] span ", end - begin);
    if (end > data_size)
      fail(tw, ": data_offsets [", begin, ", ", end, "] extend past the ", data_size,
           "-byte data section (file truncated?)");
    TensorInfo info{name,
                    *dtype,
                    std::move(shape),
                    f->base_ + f->data_offset_ + begin,
                    static_cast<size_t>(end - begin),
                    path};
    auto [it, inserted] = f->tensors_.emplace(name, std::move(info));
    (void)inserted;  // keys are unique: parse_json refuses duplicates
    if (begin != end) ranges.push_back({begin, end, &it->first});
  }

  // Empty tensors own no bytes, so they cannot overlap anything. The reference reader also refuses
  // gaps between tensors; we allow them, since they are harmless to a reader that only follows
  // offsets.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const Range &a = ranges[i - 1], &b = ranges[i];
    if (b.begin < a.end)
      fail(where, ": tensors '", *a.name, "' [", a.begin, ", ", a.end, ") and '", *b.name, "' [",
           b.begin, ", ", b.end, ") overlap");
  }
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (base_) ::munmap(const_cast<uint8_t*>(base_), size_);
}

const TensorInfo* SafetensorsFile::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---- Checkpoint --------------------------------------------------------------------------------

std::unique_ptr<Checkpoint> Checkpoint::open(const std::string& dir) {
  const std::string where = "checkpoint '" + dir + "'";
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) fail(where, ": not a directory");
  std::unique_ptr<Checkpoint> ck(new Checkpoint());
  ck->dir_ = dir;
  const fs::path index_path = fs::path(dir) / kIndexName;
  const fs::path single_path = fs::path(dir) / kSingleName;

  if (!fs::exists(index_path, ec)) {
    if (!fs::exists(single_path, ec))
      fail(where, ": has neither ", kIndexName, " nor ", kSingleName);
    ck->files_.push_back(SafetensorsFile::open(single_path.string()));
    for (const auto& [name, info] : ck->files_[0]->tensors()) ck->tensors_.emplace(name, &info);
    return ck;
  }

  const std::string iw = "index '" + index_path.string() + "'";
  std::ifstream in(index_path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) fail(iw, ": cannot read");
  json index = parse_json(text.data(), text.data() + text.size(), iw);
  if (!index.is_object()) fail(iw, ": is a JSON ", index.type_name(), ", expected an object");
  auto wm = index.find("weight_map");
  if (wm == index.end() || !wm->is_object()) fail(iw, ": has no \"weight_map\" object");

  // shard file -> tensor names the index puts there
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto& [name, file] : wm->items()) {
    if (!file.is_string())
      fail(iw, ": weight_map['", name, "'] is ", brief(file), ", expected a shard file name");
    const auto& fname = file.get_ref<const std::string&>();
    // A shard is a file of this directory; anything else (a path, "..") could reach outside it.
    if (fname.empty() || fname == "." || fname == ".." || fname.find('/') != std::string::npos)
      fail(iw, ": weight_map['", name, "'] = '", fname, "' is not a file name in the directory");
    by_shard[fname].push_back(name);
  }
  if (by_shard.empty()) fail(iw, ": weight_map is empty");

  for (const auto& [fname, names] : by_shard) {
    const std::string shard_path = (fs::path(dir) / fname).string();
    std::unique_ptr<SafetensorsFile> shard;
    try {
      shard = SafetensorsFile::open(shard_path);
    } catch (const Error& e) {
      fail(where, ": shard '", fname, "' (holding ", names.size(), " tensors of the index, e.g. '",
           names.front(), "'): ", e.what());
    }
    for (const auto& name : names) {
      const TensorInfo* t = shard->find(name);
      if (!t)
        fail(where, ": ", kIndexName, " puts tensor '", name, "' in shard '", fname,
             "', which has no such tensor");
      ck->tensors_.emplace(name, t);
    }
    // A tensor the index does not list is refused rather than ignored: HF loaders never see it, so
    // it is either a leftover from a bad conversion or a second copy of a name, and which copy
    // would win is not something to guess.
    if (shard->tensors().size() != names.size()) {
      for (const auto& [name, info] : shard->tensors()) {
        auto it = wm->find(name);
        if (it == wm->end())
          fail(where, ": shard '", fname, "' holds tensor '", name, "', which ", kIndexName,
               " does not list");
        if (*it != fname)
          fail(where, ": shard '", fname, "' holds tensor '", name, "', which ", kIndexName,
               " puts in '", it->get<std::string>(), "'");
      }
    }
    ck->files_.push_back(std::move(shard));
  }
  return ck;
}

const TensorInfo* Checkpoint::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : it->second;
}

const TensorInfo& Checkpoint::get(std::string_view name) const {
  const TensorInfo* t = find(name);
  if (!t) fail("checkpoint '", dir_, "': no tensor '", name, "'");
  return *t;
}

// ---- Writing -----------------------------------------------------------------------------------

void SafetensorsWriter::add(std::string name, DType dtype, std::vector<int64_t> shape,
                            std::vector<uint8_t> bytes) {
  add(TensorData{std::move(name), dtype, std::move(shape), std::move(bytes)});
}

void SafetensorsWriter::add(TensorData t) {
  if (t.name == "__metadata__") fail("safetensors writer: '__metadata__' is not a tensor name");
  for (const auto& o : tensors_)
    if (o.name == t.name) fail("safetensors writer: tensor '", t.name, "' added twice");
  auto sizes = checked_sizes(t.shape, dtype_size(t.dtype));
  if (!sizes)
    fail("safetensors writer: tensor '", t.name, "' has invalid shape ", shape_str(t.shape));
  if (t.bytes.size() != sizes->second)
    fail("safetensors writer: tensor '", t.name, "' shape ", shape_str(t.shape), " ",
         dtype_name(t.dtype), " needs ", sizes->second, " bytes, got ", t.bytes.size());
  data_bytes_ += t.bytes.size();
  tensors_.push_back(std::move(t));
}

void SafetensorsWriter::set_metadata(std::string key, std::string value) {
  metadata_[std::move(key)] = std::move(value);
}

void SafetensorsWriter::write(const std::string& path) const {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata_.empty()) header["__metadata__"] = metadata_;
  size_t offset = 0;
  for (const auto& t : tensors_) {
    header[t.name] = {{"dtype", dtype_name(t.dtype)},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.bytes.size()}}};
    offset += t.bytes.size();
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // a name or metadata string that is not UTF-8
    fail("safetensors writer '", path, "': cannot encode the header: ", e.what());
  }
  // Padding keeps the data section 8-byte aligned in the file (and so in the mapping).
  text.append((8 - text.size() % 8) % 8, ' ');
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));

  // The process id keeps two writers of the same file (two test processes writing one fixture)
  // from renaming each other's half-written file away; the last rename wins whole.
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) fail("safetensors writer: cannot create '", tmp, "': ", std::strerror(errno));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& t : tensors_)
      out.write(reinterpret_cast<const char*>(t.bytes.data()),
                static_cast<std::streamsize>(t.bytes.size()));
    out.close();
    if (!out) {
      std::error_code ec;
      fs::remove(tmp, ec);
      fail("safetensors writer: writing '", tmp, "' failed");
    }
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) fail("safetensors writer: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

std::string shard_file_name(int index, int num_shards) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05d-of-%05d.safetensors", index, num_shards);
  return buf;
}

void write_sharded_checkpoint(const std::string& dir, std::vector<TensorData> tensors,
                              int num_shards, const std::map<std::string, std::string>& metadata) {
  if (num_shards < 1 || static_cast<size_t>(num_shards) > tensors.size())
    fail("write_sharded_checkpoint '", dir, "': ", num_shards, " shards for ", tensors.size(),
         " tensors (need 1 <= shards <= tensors)");
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("write_sharded_checkpoint: cannot create '", dir, "': ", ec.message());

  unsigned __int128 total = 0;
  for (const auto& t : tensors) total += t.bytes.size();
  std::vector<SafetensorsWriter> shards(num_shards);
  nlohmann::json weight_map = nlohmann::json::object();
  unsigned __int128 done = 0;
  size_t shard = 0;
  const size_t n = tensors.size();
  for (size_t i = 0; i < n; ++i) {
    const size_t size = tensors[i].bytes.size();
    const size_t shards_after = num_shards - shard - 1;
    if (shards_after > 0 && !shards[shard].tensors().empty()) {
      // Shard s should end near byte total*(s+1)/num_shards: end it before this tensor when that
      // lands closer to the target than ending after it, and whenever every later shard needs one
      // of the tensors left. Scaled by num_shards to stay in integers.
      const unsigned __int128 target = total * (shard + 1), before = done * num_shards,
                              after = (done + size) * num_shards;
      if (n - i == shards_after || before >= target ||
          (after > target && target - before < after - target))
        ++shard;
    }
    if (weight_map.contains(tensors[i].name))
      fail("write_sharded_checkpoint '", dir, "': tensor '", tensors[i].name, "' given twice");
    weight_map[tensors[i].name] = shard_file_name(static_cast<int>(shard) + 1, num_shards);
    shards[shard].add(std::move(tensors[i]));
    done += size;
  }
  for (int s = 0; s < num_shards; ++s) {
    for (const auto& [k, v] : metadata) shards[s].set_metadata(k, v);
    shards[s].write((fs::path(dir) / shard_file_name(s + 1, num_shards)).string());
  }
  nlohmann::json index = {{"metadata", {{"total_size", static_cast<uint64_t>(total)}}},
                          {"weight_map", std::move(weight_map)}};
  const std::string index_path = (fs::path(dir) / Checkpoint::kIndexName).string();
  std::ofstream out(index_path, std::ios::trunc);
  out << index.dump(2) << "\n";
  out.close();
  if (!out) fail("write_sharded_checkpoint: writing '", index_path, "' failed");
}

}  // namespace dsuf
