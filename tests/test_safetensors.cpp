// safetensors reader/writer: round trips, a hand-made file, and every malformed-file rejection.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "core/crc32c.h"
#include "core/dtype.h"
#include "core/error.h"
#include "io/safetensors.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace sf;

namespace {

using test::expect_input_error;
using test::TempDir;

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void write_all(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

// A safetensors file from a header string and data bytes, built independently of the writer.
std::string make_file(const std::string& header, const std::string& data, uint64_t header_len = UINT64_MAX) {
  if (header_len == UINT64_MAX) header_len = header.size();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = char((header_len >> (8 * i)) & 0xff);
  return out + header + data;
}

// Writes a file from header + data and expects opening it to fail mentioning `parts` and the path.
void expect_bad_file(const TempDir& d, const std::string& name, const std::string& bytes,
                     std::vector<std::string> parts) {
  std::string p = d.file(name);
  write_all(p, bytes);
  parts.push_back(p + ": ");
  expect_input_error([&] { SafetensorsFile::open(p); }, parts);
}

}  // namespace

TEST(Safetensors, RoundTripAllDtypesMetadataAlignment) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> b = {float_to_bf16(1.0f).bits, float_to_bf16(-0.5f).bits, float_to_bf16(3.25f).bits};
  std::vector<uint16_t> h = {float_to_f16(0.5f), float_to_f16(-65504.f), float_to_f16(2.0f), float_to_f16(1e-5f)};
  std::vector<TensorWrite> tw = {{"z.weight", DType::F32, {2, 3}, a.data()},
                                 {"a.bias", DType::BF16, {3}, b.data()},
                                 {"m.half", DType::F16, {2, 1, 2}, h.data()},
                                 {"empty", DType::F32, {0, 4}, nullptr}};
  std::string path = d.file("x.safetensors");
  write_safetensors(path, tw, {{"step", "12"}, {"note", "hello"}});

  // Header length prefix is a multiple of 8 and the padding is spaces.
  std::string raw = read_all(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(raw.size(), 8 + n + a.size() * 4 + b.size() * 2 + h.size() * 2);
  auto hdr = nlohmann::json::parse(raw.substr(8, n));  // trailing spaces are valid JSON whitespace
  EXPECT_EQ(hdr["__metadata__"]["format"], "pt");
  EXPECT_EQ(hdr["z.weight"]["data_offsets"], nlohmann::json({0, 24}));
  EXPECT_EQ(hdr["a.bias"]["data_offsets"], nlohmann::json({24, 30}));
  // No temp file left behind next to it.
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 1);

  SafetensorsFile f0 = SafetensorsFile::open(path);
  SafetensorsFile f = std::move(f0);  // moved-to object keeps the mapping
  ASSERT_EQ(f.tensors().size(), 4u);
  // File order = the order written (zero-size tensor sorts to its offset, the end).
  EXPECT_EQ(f.tensors()[0].name, "z.weight");
  EXPECT_EQ(f.tensors()[1].name, "a.bias");
  EXPECT_EQ(f.tensors()[2].name, "m.half");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.metadata().at("step"), "12");
  EXPECT_EQ(f.metadata().at("note"), "hello");

  const TensorInfo* ta = f.find("z.weight");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, DType::F32);
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ta->bytes, 24u);
  EXPECT_EQ(ta->file, path);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(ta->data) % 8, 0u);  // data area aligned by the padding
  EXPECT_EQ(std::memcmp(ta->data, a.data(), 24), 0);
  const TensorInfo* tb = f.find("a.bias");
  ASSERT_NE(tb, nullptr);
  EXPECT_EQ(tb->dtype, DType::BF16);
  EXPECT_EQ(std::memcmp(tb->data, b.data(), 6), 0);
  const TensorInfo* th = f.find("m.half");
  ASSERT_NE(th, nullptr);
  EXPECT_EQ(th->dtype, DType::F16);
  EXPECT_EQ(th->shape, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(std::memcmp(th->data, h.data(), 8), 0);
  const TensorInfo* te = f.find("empty");
  ASSERT_NE(te, nullptr);
  EXPECT_EQ(te->bytes, 0u);
  EXPECT_EQ(te->numel(), 0);
  EXPECT_EQ(f.find("nope"), nullptr);
}

// Tensors produced on demand (fill) give the same file as tensors handed over in memory, and each
// is asked for once, in file order (a model is saved one tensor at a time).
TEST(Safetensors, FilledTensorsWriteTheSameBytes) {
  TempDir d;
  std::vector<float> a = {1.5f, -2.25f, 3.0f, 0.0f, 1e-3f, -7.0f};
  std::vector<uint16_t> b = {float_to_bf16(1.0f).bits, float_to_bf16(-0.5f).bits, float_to_bf16(3.25f).bits};
  write_safetensors(d.file("direct.safetensors"),
                    {{"z.weight", DType::F32, {2, 3}, a.data()}, {"a.bias", DType::BF16, {3}, b.data()}});
  std::vector<std::string> asked;
  TensorWrite fa{"z.weight", DType::F32, {2, 3}, nullptr}, fb{"a.bias", DType::BF16, {3}, nullptr};
  fa.fill = [&](void* dst) {
    asked.push_back("z.weight");
    std::memcpy(dst, a.data(), a.size() * 4);
  };
  fb.fill = [&](void* dst) {
    asked.push_back("a.bias");
    std::memcpy(dst, b.data(), b.size() * 2);
  };
  write_safetensors(d.file("filled.safetensors"), {fa, fb});
  EXPECT_EQ(read_all(d.file("direct.safetensors")), read_all(d.file("filled.safetensors")));
  EXPECT_EQ(asked, (std::vector<std::string>{"z.weight", "a.bias"}));
}

TEST(Safetensors, ReadsHandCraftedFile) {
  TempDir d;
  // Keys out of data order, odd header length (no padding), unaligned data area, a metadata block.
  float w[2] = {3.5f, -1.0f};
  uint16_t hb[3] = {0x3f80, 0xc000, 0x0000};  // bf16 1.0, -2.0, 0.0
  std::string data(reinterpret_cast<const char*>(hb), 6);
  data += std::string(reinterpret_cast<const char*>(w), 8);
  std::string header =
      R"({"w":{"dtype":"F32","shape":[1,2],"data_offsets":[6,14]},)"
      R"("__metadata__":{"format":"pt","k":"v"},"b":{"dtype":"BF16","shape":[3],"data_offsets":[0,6]}})";
  std::string path = d.file("hand.safetensors");
  write_all(path, make_file(header, data));

  SafetensorsFile f = SafetensorsFile::open(path);
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.tensors()[0].name, "b");  // offset order
  EXPECT_EQ(f.tensors()[1].name, "w");
  EXPECT_EQ(f.metadata().size(), 2u);
  EXPECT_EQ(f.metadata().at("k"), "v");
  const TensorInfo* tw = f.find("w");
  ASSERT_NE(tw, nullptr);
  EXPECT_EQ(tw->shape, (std::vector<int64_t>{1, 2}));
  float got[2];
  std::memcpy(got, tw->data, 8);
  EXPECT_EQ(got[0], 3.5f);
  EXPECT_EQ(got[1], -1.0f);
  const TensorInfo* tb = f.find("b");
  ASSERT_NE(tb, nullptr);
  uint16_t gb[3];
  std::memcpy(gb, tb->data, 6);
  EXPECT_EQ(bf16_to_float(bf16{gb[0]}), 1.0f);
  EXPECT_EQ(bf16_to_float(bf16{gb[1]}), -2.0f);
  EXPECT_EQ(tb->data + 6, tw->data);

  // A header-only file (no tensors) is valid too.
  std::string p2 = d.file("empty.safetensors");
  write_all(p2, make_file("{}", ""));
  EXPECT_TRUE(SafetensorsFile::open(p2).tensors().empty());
}

TEST(Safetensors, RejectsTruncatedAndBadHeaderLength) {
  TempDir d;
  expect_bad_file(d, "short.safetensors", "abc", {"too short"});
  expect_bad_file(d, "zero.safetensors", "", {"too short"});
  std::string good_header = R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  expect_bad_file(d, "len_past_end.safetensors", make_file(good_header, std::string(8, '\0'), 4096),
                  {"header length 4096 exceeds the file size"});
  expect_bad_file(d, "absurd.safetensors", make_file("{}", "", 1ull << 40), {"absurd"});
  // Data truncated: header fine, but the tensor's range runs past the end.
  expect_bad_file(d, "cut.safetensors", make_file(good_header, std::string(5, '\0')), {"tensor t", "out of range"});
  std::string missing = d.file("missing.safetensors");
  expect_input_error([&] { SafetensorsFile::open(missing); }, {missing + ": not found"});
}

TEST(Safetensors, RejectsBadJsonMissingFieldsAndBadMetadata) {
  TempDir d;
  expect_bad_file(d, "badjson.safetensors", make_file(R"({"t": {"dtype": )", ""), {"invalid header JSON at byte"});
  expect_bad_file(d, "array.safetensors", make_file("[1,2]", ""), {"not a JSON object"});
  expect_bad_file(d, "entry.safetensors", make_file(R"({"t": 5})", ""), {"tensor t", "not an object"});
  expect_bad_file(d, "nodtype.safetensors", make_file(R"({"t":{"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor t", "missing dtype"});
  expect_bad_file(d, "noshape.safetensors", make_file(R"({"t":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"),
                  {"tensor t", "missing shape"});
  expect_bad_file(d, "nooff.safetensors", make_file(R"({"t":{"dtype":"F32","shape":[1]}})", "abcd"),
                  {"tensor t", "missing data_offsets"});
  expect_bad_file(d, "badoff.safetensors", make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", "abcd"),
                  {"tensor t", "data_offsets must be two"});
  expect_bad_file(d, "dup.safetensors",
                  make_file(R"({"t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                            R"("t":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                            "abcd"),
                  {"\"t\" twice"});
  expect_bad_file(d, "mdarr.safetensors", make_file(R"({"__metadata__":[1]})", ""), {"__metadata__ is not an object"});
  expect_bad_file(d, "mdval.safetensors", make_file(R"({"__metadata__":{"format":"pt","n":3}})", ""),
                  {"__metadata__ value for \"n\" is not a string"});
}

TEST(Safetensors, RejectsUnsupportedDtype) {
  TempDir d;
  expect_bad_file(d, "i8.safetensors",
                  make_file(R"({"layer.q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor layer.q", "unsupported dtype I8"});
  expect_bad_file(d, "f64.safetensors",
                  make_file(R"({"emb":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor emb", "unsupported dtype F64"});
}

TEST(Safetensors, RejectsShapeMismatchAndNegativeDims) {
  TempDir d;
  expect_bad_file(d, "mismatch.safetensors",
                  make_file(R"({"w":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor w", "shape [2, 3] of BF16 needs 12 bytes", "span 8"});
  expect_bad_file(d, "neg.safetensors",
                  make_file(R"({"w":{"dtype":"F32","shape":[-1,2],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor w", "negative dimension -1"});
  expect_bad_file(d, "float_dim.safetensors",
                  make_file(R"({"w":{"dtype":"F32","shape":[2.5],"data_offsets":[0,8]}})", std::string(8, '\0')),
                  {"tensor w", "non-integer dimension"});
  // Product overflowing 64 bits must not wrap to a "valid" size.
  expect_bad_file(d, "overflow.safetensors",
                  make_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}})", ""),
                  {"tensor w", "absurdly large"});
}

TEST(Safetensors, RejectsOverlapGapAndOutOfRange) {
  TempDir d;
  std::string data16(16, '\0');
  expect_bad_file(d, "overlap.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                            std::string(12, '\0')),
                  {"tensor b", "overlap tensor a"});
  expect_bad_file(d, "gap.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                            R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                            data16),
                  {"gap", "bytes 8 to 12", "tensor b"});
  expect_bad_file(d, "leading_gap.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", data16), {"gap", "tensor a"});
  expect_bad_file(d, "trailing.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data16), {"8 trailing bytes"});
  expect_bad_file(d, "range.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})", data16),
                  {"tensor a", "data_offsets [8, 24] out of range", "16 bytes"});
  expect_bad_file(d, "reversed.safetensors",
                  make_file(R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", data16),
                  {"tensor a", "end before they begin"});
}

TEST(Safetensors, WriteErrorsAreInputErrorsAndLeaveNoFile) {
  TempDir d;
  float x = 1.0f;
  // Parent is a regular file: open() fails with ENOTDIR.
  write_all(d.file("afile"), "x");
  std::string bad = d.file("afile") + "/out.safetensors";
  expect_input_error(
      [&] {
        write_safetensors(bad, {{"x", DType::F32, {1}, &x}}, {});
      },
      {bad + ": ", "Not a directory"});
  // Replacing an existing file works and leaves only the final name.
  std::string p = d.file("r.safetensors");
  write_all(p, "old contents");
  write_safetensors(p, {{"x", DType::F32, {1}, &x}}, {});
  EXPECT_EQ(SafetensorsFile::open(p).tensors().size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(d.path), fs::directory_iterator()), 2);
}

// Hostile headers: nesting far past the limit (checked on the bytes, before the parser), numbers
// out of any range, and a huge header that is a single value.
TEST(Safetensors, RejectsDeepNestingAndHugeNumbersInTheHeader) {
  TempDir d;
  const std::string deep = "{\"t\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  expect_bad_file(d, "deep.safetensors", make_file(deep, ""), {"nested deeper than 64"});
  expect_bad_file(d, "1e400.safetensors",
                  make_file(R"({"t":{"dtype":"F32","shape":[1e400],"data_offsets":[0,4]}})", "abcd"),
                  {"number overflow"});
  expect_bad_file(d, "2p64.safetensors",
                  make_file(R"({"t":{"dtype":"F32","shape":[18446744073709551616],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor t", "non-integer dimension"});
  expect_bad_file(d, "2p63.safetensors",
                  make_file(R"({"t":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,4]}})", "abcd"),
                  {"tensor t", "absurdly large"});
  // 64 levels (the limit) are still read: nesting inside __metadata__ is refused for its type.
  const std::string at_limit = "{\"__metadata__\":" + std::string(63, '[') + std::string(63, ']') + "}";
  expect_bad_file(d, "limit.safetensors", make_file(at_limit, ""), {"__metadata__ is not an object"});
}

// CRC-32C against published check values (RFC 3720 B.4 and the common "123456789" check).
TEST(Crc32c, KnownValuesAndIncremental) {
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  std::string zeros(32, '\0'), ones(32, '\xff'), inc(32, '\0');
  for (int i = 0; i < 32; ++i) inc[size_t(i)] = char(i);
  EXPECT_EQ(crc32c(zeros.data(), 32), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), 32), 0x62A8AB43u);
  EXPECT_EQ(crc32c(inc.data(), 32), 0x46DD794Eu);
  // The hardware path (where the CPU has one) equals the tables at every length and alignment.
  std::mt19937 rng(5);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = uint8_t(rng());
  for (size_t off = 0; off < 9; ++off)
    for (size_t len : {size_t(0), size_t(1), size_t(7), size_t(8), size_t(9), size_t(63), size_t(1000), size_t(4096)})
      EXPECT_EQ(crc32c(buf.data() + off, len, 0x1234u), crc32c_portable(buf.data() + off, len, 0x1234u)) << off << " " << len;
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
  // Any split, at any alignment, continues to the same value.
  std::string text(1000, '\0');
  for (size_t i = 0; i < text.size(); ++i) text[i] = char((i * 131 + 7) % 251);
  const uint32_t whole = crc32c(text.data(), text.size());
  for (size_t off : {size_t(1), size_t(3), size_t(8), size_t(13), size_t(999)})
    EXPECT_EQ(crc32c(text.data() + off, text.size() - off, crc32c(text.data(), off)), whole) << off;
}

// Every tensor's CRC-32C is in __metadata__; a flipped bit is found and named; files without
// checksums (other writers, older slideformer) verify as "none".
TEST(Safetensors, ChecksumsAreWrittenAndVerified) {
  TempDir d;
  std::vector<float> a(37);
  for (size_t i = 0; i < a.size(); ++i) a[i] = float(i) * 0.25f - 3.f;
  std::vector<uint16_t> b = {1, 2, 3};
  std::vector<TensorWrite> tw = {
      {"w.a", DType::F32, {37}, a.data()}, {"w.b", DType::BF16, {3}, nullptr}, {"empty", DType::F32, {0}, nullptr}};
  tw[1].fill = [&](void* dst) { std::memcpy(dst, b.data(), 6); };
  const std::string path = d.file("c.safetensors");
  write_safetensors(path, tw, {{"step", "3"}});
  {
    SafetensorsFile f = SafetensorsFile::open(path);
    EXPECT_EQ(f.metadata().at("crc32c.w.a").size(), 8u);
    char want[16];
    std::snprintf(want, sizeof want, "%08x", crc32c(b.data(), 6));
    EXPECT_EQ(f.metadata().at("crc32c.w.b"), want);
    EXPECT_EQ(f.metadata().at("crc32c.empty"), "00000000");
    EXPECT_TRUE(f.verify_checksums());
  }
  // One bit flipped in the data of w.a.
  std::string raw = read_all(path);
  std::string bad = raw;
  bad[bad.size() - 6 - 1 - 4 * 10] ^= 0x10;
  write_all(path, bad);
  expect_input_error([&] { SafetensorsFile::open(path).verify_checksums(); },
                     {path + ": ", "tensor w.a", "does not match"});
  // No checksums at all: not verified, not an error.
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | uint8_t(raw[size_t(i)]);
  nlohmann::json hdr = nlohmann::json::parse(raw.substr(8, n));
  nlohmann::json md = hdr["__metadata__"];
  hdr["__metadata__"] = {{"format", "pt"}};
  write_all(path, make_file(hdr.dump(), raw.substr(8 + n)));
  EXPECT_FALSE(SafetensorsFile::open(path).verify_checksums());
  // Some but not all, a malformed one, one for a tensor the file lacks: errors naming the tensor.
  hdr["__metadata__"] = md;
  hdr["__metadata__"].erase("crc32c.w.b");
  write_all(path, make_file(hdr.dump(), raw.substr(8 + n)));
  expect_input_error([&] { SafetensorsFile::open(path).verify_checksums(); }, {"tensor w.b", "no checksum"});
  hdr["__metadata__"] = md;
  hdr["__metadata__"]["crc32c.w.b"] = "XYZ";
  write_all(path, make_file(hdr.dump(), raw.substr(8 + n)));
  expect_input_error([&] { SafetensorsFile::open(path).verify_checksums(); }, {"tensor w.b", "hex"});
  hdr["__metadata__"] = md;
  hdr["__metadata__"]["crc32c.ghost"] = "00000000";
  write_all(path, make_file(hdr.dump(), raw.substr(8 + n)));
  expect_input_error([&] { SafetensorsFile::open(path).verify_checksums(); }, {"ghost"});
  hdr["__metadata__"] = md;
  write_all(path, make_file(hdr.dump(), raw.substr(8 + n)));
  EXPECT_TRUE(SafetensorsFile::open(path).verify_checksums());
}

// The finite-value check (verify_checksums(true)) finds an Inf or NaN at any index of any dtype,
// across chunks and in the tail that is not a whole 8-byte word, and passes the largest finite
// values of either sign.
TEST(Safetensors, NonFiniteValuesAreFoundAtAnyIndex) {
  TempDir d;
  struct Kind {
    DType dtype;
    uint32_t largest, inf, nan;  // bit patterns
  };
  const Kind kinds[] = {{DType::F32, 0x7f7fffffu, 0x7f800000u, 0x7fc00001u},
                        {DType::BF16, 0x7f7fu, 0x7f80u, 0x7fc1u},
                        {DType::F16, 0x7bffu, 0x7c00u, 0x7e01u}};
  const std::string path = d.file("t.safetensors");
  for (const Kind& k : kinds) {
    const size_t es = dtype_size(k.dtype);
    for (size_t n : {size_t(1), size_t(3), size_t(5), size_t(1000), size_t(300001)}) {
      std::vector<uint8_t> bytes(n * es);
      auto put = [&](size_t i, uint32_t bits) { std::memcpy(bytes.data() + i * es, &bits, es); };
      for (size_t i = 0; i < n; ++i) put(i, i % 2 ? k.largest : (k.largest | (es == 4 ? 0x80000000u : 0x8000u)));
      write_safetensors(path, {{"x", k.dtype, {int64_t(n)}, bytes.data()}});
      EXPECT_TRUE(SafetensorsFile::open(path).verify_checksums(true)) << n;
      for (size_t at : {size_t(0), n / 2, n - 1}) {
        for (uint32_t bad : {k.inf, k.nan, k.inf | (es == 4 ? 0x80000000u : 0x8000u)}) {
          std::vector<uint8_t> b = bytes;
          std::memcpy(b.data() + at * es, &bad, es);
          write_safetensors(path, {{"x", k.dtype, {int64_t(n)}, b.data()}});
          const SafetensorsFile f = SafetensorsFile::open(path);
          expect_input_error([&] { f.verify_checksums(true); },
                             {path + ": tensor x: element " + std::to_string(at) + " is NaN or infinite"});
          EXPECT_TRUE(f.verify_checksums(false));  // the checksums still match
        }
      }
    }
  }
}
