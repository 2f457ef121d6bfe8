// The safetensors reader refuses every malformed input of model.md section 1
// with an error naming the file and the tensor, and never crashes: hundreds of
// truncated, bit-flipped and oversized headers are generated below.
#include "moeserve/engine/safetensors.hpp"
#include "moeserve/common/durable_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>

namespace moeserve::engine {
namespace {

namespace fs = std::filesystem;

std::vector<uint8_t> Bytes(size_t n, uint8_t start = 0) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(start + i);
  return v;
}

std::vector<uint8_t> SampleFile() {
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  EXPECT_TRUE(w.Add("a", DType::kF32, {2, 3}, Bytes(24)));
  EXPECT_TRUE(w.Add("b", DType::kBF16, {4}, Bytes(8, 100)));
  EXPECT_TRUE(w.Add("c", DType::kU8, {3, 2, 16}, Bytes(96, 7)));
  return w.Serialize();
}

// Builds a file image from a raw header and a data section.
std::vector<uint8_t> WithHeader(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  out.insert(out.end(), header.begin(), header.end());
  out.resize(out.size() + data_bytes, 0xAB);
  return out;
}

std::string ErrorOf(const std::vector<uint8_t>& image) {
  auto r = SafetensorsFile::FromBytes("m/x.safetensors", image);
  if (r) return "";
  EXPECT_EQ(r.error().code(), ErrorCode::kCorruption) << r.error().ToString();
  return r.error().message();
}

TEST(Safetensors, RoundTripIsZeroCopy) {
  auto image = SampleFile();
  auto f = SafetensorsFile::FromBytes("mem", image);
  ASSERT_TRUE(f) << f.error().ToString();
  ASSERT_EQ((*f)->tensors().size(), 3u);
  const TensorView* c = (*f)->Find("c");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(c->dtype, DType::kU8);
  EXPECT_EQ(c->ShapeString(), "[3, 2, 16]");
  EXPECT_EQ(c->nbytes, 96u);
  EXPECT_GE(c->data, image.data());
  EXPECT_LT(c->data, image.data() + image.size());  // points into the image: no copy
  EXPECT_EQ(c->data[0], 7);
  EXPECT_EQ((*f)->metadata().at("format"), "pt");
  // Data starts 8-byte aligned.
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u);
}

TEST(Safetensors, OpensFromDiskWithMmap) {
  std::string dir = testing::TempDir() + "/st_disk_" + std::to_string(::getpid());
  fs::create_directories(dir);
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("w", DType::kF32, {4}, Bytes(16)));
  ASSERT_TRUE(w.WriteFile(dir + "/model.safetensors"));
  auto f = SafetensorsFile::Open(dir + "/model.safetensors");
  ASSERT_TRUE(f) << f.error().ToString();
  EXPECT_EQ((*f)->Find("w")->data[15], 15);
  auto missing = SafetensorsFile::Open(dir + "/nope.safetensors");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("nope.safetensors"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Safetensors, RefusesEachMalformedCaseWithFileAndTensor) {
  struct Case {
    std::string header;
    size_t data;
    std::string expect;  // substring of the message
  };
  const std::vector<Case> cases = {
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4, "tensor 't': data_offsets [0,8] run past the end"},
      {R"({"t":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "tensor 't': shape [3] of F32 needs 12 bytes"},
      {R"({"t":{"dtype":"Q4","shape":[2],"data_offsets":[0,8]}})", 8, "tensor 't': unknown dtype 'Q4'"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8, "tensor 't': data_offsets [8,0] end before"},
      {R"({"t":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8, "tensor 't': shape [-2] has a non-integer"},
      {R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8, "tensor 't': 'data_offsets' must be an array of two"},
      {R"({"t":{"shape":[2],"data_offsets":[0,8]}})", 8, "tensor 't': missing or non-string 'dtype'"},
      {R"({"t":{"dtype":"F32","data_offsets":[0,8]}})", 8, "tensor 't': missing or non-array 'shape'"},
      {R"({"t":7})", 8, "tensor 't': entry is not an object"},
      {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", 12,
       "overlaps tensor"},
      {R"({"t":{"dtype":"F32","shape":[4611686018427387904, 4],"data_offsets":[0,8]}})", 8, "is too large"},
      // Found by fuzz_safetensors: the product is 0, yet int64 shape[1] was negative.
      {R"({"t":{"dtype":"U8","shape":[0,9223372036854775808],"data_offsets":[0,0]}})", 0, "is too large"},
      {R"({"__metadata__":{"k":1}})", 0, "__metadata__ entry 'k' is not a string"},
      {R"([1,2,3])", 0, "header is not a JSON object"},
      {R"({"t":)", 0, "header: not valid JSON"},
  };
  for (const auto& c : cases) {
    std::string msg = ErrorOf(WithHeader(c.header, c.data));
    EXPECT_NE(msg.find("m/x.safetensors"), std::string::npos) << c.header << " -> " << msg;
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.header << " -> " << msg;
  }
}

TEST(Safetensors, HeaderLengthLargerThanFile) {
  std::vector<uint8_t> image = WithHeader("{}", 0);
  uint64_t n = 1000;
  std::memcpy(image.data(), &n, 8);
  EXPECT_NE(ErrorOf(image).find("header length 1000 exceeds the file"), std::string::npos);
  EXPECT_NE(ErrorOf({1, 2, 3}).find("too short for the 8-byte header length"), std::string::npos);
}

TEST(SafetensorsFuzz, TruncatedFilesAllFailCleanly) {
  auto image = SampleFile();
  int refused = 0;
  for (size_t len = 0; len < image.size(); ++len) {
    std::vector<uint8_t> cut(image.begin(), image.begin() + static_cast<long>(len));
    auto r = SafetensorsFile::FromBytes("cut", cut);
    // Truncation inside the data makes the last tensor's offsets run past the end.
    ASSERT_FALSE(r) << "length " << len << " of " << image.size() << " was accepted";
    ++refused;
  }
  EXPECT_EQ(refused, static_cast<int>(image.size()));
}

TEST(SafetensorsFuzz, BitFlippedHeadersNeverCrash) {
  auto image = SampleFile();
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  std::mt19937_64 rng(42);
  int accepted = 0, refused = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    auto copy = image;
    int flips = 1 + static_cast<int>(rng() % 4);
    for (int f = 0; f < flips; ++f) {
      size_t pos = rng() % (8 + n);  // the length field and the header
      copy[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    auto r = SafetensorsFile::FromBytes("flip", copy);
    if (!r) {
      ++refused;
      EXPECT_FALSE(r.error().message().empty());
      continue;
    }
    ++accepted;
    // Whatever was accepted must be internally consistent.
    for (const auto& t : (*r)->tensors()) {
      ASSERT_GE(t.data, copy.data());
      ASSERT_LE(t.data + t.nbytes, copy.data() + copy.size());
      ASSERT_EQ(static_cast<size_t>(t.numel()) * DTypeSize(t.dtype), t.nbytes);
    }
  }
  EXPECT_GT(refused, 1000);  // most flips break JSON, offsets or sizes
  EXPECT_EQ(accepted + refused, 2000);
}

TEST(SafetensorsFuzz, OversizedAndRandomHeaderLengths) {
  std::mt19937_64 rng(7);
  auto image = SampleFile();
  for (int iter = 0; iter < 500; ++iter) {
    auto copy = image;
    uint64_t n = iter < 64 ? (uint64_t{1} << iter) : rng();
    if (iter % 3 == 0) n = kMaxSafetensorsHeaderBytes + 1 + (rng() % 1000);
    std::memcpy(copy.data(), &n, 8);
    auto r = SafetensorsFile::FromBytes("len", copy);
    uint64_t real = 0;
    std::memcpy(&real, image.data(), 8);
    if (n == real) continue;
    EXPECT_FALSE(r) << "header length " << n;
  }
  // A header past the 100 MB limit is refused before parsing, even inside a big file.
  std::vector<uint8_t> big(8 + kMaxSafetensorsHeaderBytes + 16, ' ');
  uint64_t n = kMaxSafetensorsHeaderBytes + 8;
  std::memcpy(big.data(), &n, 8);
  EXPECT_NE(ErrorOf(big).find("exceeds the"), std::string::npos);
}

TEST(SafetensorsFuzz, RandomJsonValuesInEntries) {
  std::mt19937_64 rng(3);
  const std::vector<std::string> values = {"null", "true", "-1", "1.5", "\"F32\"", "[]", "{}", "[0,4]", "[4,0]",
                                           "[1,2,3]", "\"\"", "[18446744073709551615,0]", "[0,18446744073709551615]", "[2]"};
  for (int iter = 0; iter < 600; ++iter) {
    std::string dtype = iter % 5 == 0 ? values[rng() % values.size()] : "\"F32\"";
    std::string shape = iter % 5 == 1 ? values[rng() % values.size()] : "[1]";
    std::string offs = iter % 5 >= 2 ? values[rng() % values.size()] : "[0,4]";
    std::string header = R"({"t":{"dtype":)" + dtype + R"(,"shape":)" + shape + R"(,"data_offsets":)" + offs + "}}";
    auto image = WithHeader(header, 4);
    auto r = SafetensorsFile::FromBytes("rand", image);
    // A scalar (shape []) of F32 is 4 bytes too.
    bool valid = dtype == "\"F32\"" && (shape == "[1]" || shape == "[]") && offs == "[0,4]";
    EXPECT_EQ(static_cast<bool>(r), valid) << header;
    if (!r) {
      EXPECT_NE(r.error().message().find("tensor 't'"), std::string::npos) << r.error().message();
    }
  }
}

TEST(Checkpoint, ShardedIndexMustMatchShards) {
  std::string dir = testing::TempDir() + "/st_shards_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  SafetensorsWriter a, b;
  ASSERT_TRUE(a.Add("x", DType::kF32, {1}, Bytes(4)));
  ASSERT_TRUE(b.Add("y", DType::kF32, {1}, Bytes(4)));
  ASSERT_TRUE(a.WriteFile(dir + "/s1.safetensors"));
  ASSERT_TRUE(b.WriteFile(dir + "/s2.safetensors"));
  // Two shards without an index are ambiguous.
  auto none = Checkpoint::Open(dir);
  ASSERT_FALSE(none);
  EXPECT_NE(none.error().message().find("no model.safetensors.index.json"), std::string::npos);

  auto write_index = [&](const std::string& text) {
    ASSERT_TRUE(WriteFileDurably(dir + "/model.safetensors.index.json", text));
  };
  write_index(R"({"weight_map":{"x":"s1.safetensors","y":"s2.safetensors"}})");
  auto ok = Checkpoint::Open(dir);
  ASSERT_TRUE(ok) << ok.error().ToString();
  EXPECT_NE(ok->Find("y"), nullptr);
  EXPECT_EQ(ok->shards().size(), 2u);

  write_index(R"({"weight_map":{"x":"s1.safetensors","y":"s1.safetensors"}})");
  auto wrong = Checkpoint::Open(dir);
  ASSERT_FALSE(wrong);
  EXPECT_NE(wrong.error().message().find("tensor 'y' is mapped to s1.safetensors"), std::string::npos);

  write_index(R"({"weight_map":{"x":"../s1.safetensors"}})");
  EXPECT_FALSE(Checkpoint::Open(dir));
  write_index(R"({"weight_map":{"x":"s1.safetensors","y":"s3.safetensors"}})");
  auto missing = Checkpoint::Open(dir);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().message().find("s3.safetensors"), std::string::npos);
  write_index("not json");
  EXPECT_FALSE(Checkpoint::Open(dir));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace moeserve::engine
